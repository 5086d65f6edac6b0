"""Process sets at `init()`: the checks of ``init(process_sets=[...])``, their registration, and the
binding of a repeated init's ProcessSet objects to the sets already registered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from ..backends.base import Backend
from ..errors import InvalidArgumentError, UnisonNotImplementedError
from ..process_sets import ProcessSet, bind, global_process_set, unbind

if TYPE_CHECKING:
    from .runtime import Job

__all__ = ["bind_again", "check_process_sets", "register_sets"]


def register_sets(backend: Backend, process_sets: Sequence[ProcessSet] | None, mpi: ModuleType | None,
                  ) -> tuple[dict[int, tuple[int, ...]], dict[int, ProcessSet], InvalidArgumentError | None]:
    """Register the global set and `process_sets` (checked by `check_process_sets`) on `backend`: the
    table of registered sets, the ProcessSet objects by id, and the error for duplicates (raised after
    the job started, as Horovod does)."""
    rank, size = backend.rank, backend.size
    registered = {0: tuple(range(size))}
    sets: dict[int, ProcessSet] = {0: global_process_set}
    bind(global_process_set, 0, list(range(size)), rank)
    duplicates: list[tuple[ProcessSet, int]] = []
    for ps in process_sets or []:
        ranks = _ranks_of(ps, mpi)
        known = _set_id_of(registered, ranks)
        if known is not None:
            # Horovod registers the other sets, then raises: the job runs, this object stays
            # unregistered (unless it is the very object registered earlier in the list).
            if sets.get(known) is not ps:
                unbind(ps)
            duplicates.append((ps, known))
            continue
        set_id = len(registered)
        backend.add_process_set(set_id, ranks)
        registered[set_id] = tuple(ranks)
        bind(ps, set_id, ranks, rank)
        sets[set_id] = ps
    return registered, sets, _duplicate_error(duplicates, registered) if duplicates else None


def _set_id_of(registered: Mapping[int, tuple[int, ...]], ranks: Sequence[int]) -> int | None:
    """The id of the registered set with exactly these ranks, or None."""
    wanted = tuple(ranks)
    for set_id, members in registered.items():
        if tuple(members) == wanted:
            return set_id
    return None


def _duplicate_error(duplicates: list[tuple[ProcessSet, int]],
                     registered: Mapping[int, tuple[int, ...]]) -> InvalidArgumentError:
    ps, known = duplicates[0]
    where = "the global process set" if known == 0 else f"process set {known}"
    others = "; ".join(f"{set_id}: {list(ranks)}" for set_id, ranks in sorted(registered.items()))
    return InvalidArgumentError(
        f"Attempted to add a duplicate process set: {ps}; its ranks {list(registered[known])} are "
        f"{where}'s. unison is initialized with the other sets (id: ranks {others}); call "
        "init(process_sets=[...]) again with a list without duplicates to bind its ProcessSet objects."
    )


def bind_again(current: Job, process_sets: Sequence[ProcessSet]) -> None:
    """A repeated init(process_sets=[...]): bind each object to the registered set of its ranks."""
    check_process_sets(process_sets, current.size)
    registered = current.registered_sets()
    duplicates: list[tuple[ProcessSet, int]] = []
    bound: dict[int, ProcessSet] = {}
    for ps in process_sets:
        ranks = _ranks_of(ps, current.mpi)
        set_id = _set_id_of(registered, ranks)
        if set_id is None:
            listing = "; ".join(f"{i}: {list(r)}" for i, r in sorted(registered.items()))
            raise InvalidArgumentError(
                f"init() was called again with {ps}, whose ranks {list(ranks)} are not a registered "
                f"process set (id: ranks {listing}). Sets are registered by the first init(); add "
                "this one with add_process_set() (init(process_sets='dynamic')), or call shutdown() "
                "first."
            )
        if set_id == 0 or set_id in bound:
            if ps is not global_process_set and bound.get(set_id) is not ps:
                unbind(ps)
            duplicates.append((ps, set_id))
            continue
        bind(ps, set_id, list(ranks), current.rank)
        bound[set_id] = ps
        if current.process_sets.get(set_id) is not ps and all(p is not ps for p in current.rebound_sets):
            current.rebound_sets.append(ps)
    if duplicates:
        raise _duplicate_error(duplicates, dict(registered))


def check_process_sets(process_sets: Sequence[ProcessSet] | None, size: int) -> None:
    """The local checks of init()'s process_sets (the communicator-based ones are resolved later)."""
    for index, ps in enumerate(process_sets or []):
        if not isinstance(ps, ProcessSet):
            raise InvalidArgumentError(
                f"process_sets must contain ProcessSet objects. Got {type(ps).__name__} at index {index}."
            )
        if ps.mpi_comm is None and ps.ranks is not None:
            bad = [r for r in ps.ranks if not 0 <= r < size]
            if bad or not ps.ranks:
                raise InvalidArgumentError(f"A process set needs ranks in range(size={size}). Got {ps.ranks}.")


def _ranks_of(ps: ProcessSet, mpi: ModuleType | None) -> list[int]:
    """A process set's global ranks (a list set was range-checked by `check_process_sets`)."""
    if ps.mpi_comm is None:
        assert ps.ranks is not None
        return list(ps.ranks)
    if mpi is None:
        raise UnisonNotImplementedError("Communicator-based process sets need MPI.")
    group = ps.mpi_comm.Get_group()
    world_group = mpi.COMM_WORLD.Get_group()
    ranks = mpi.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
    gathered = mpi.COMM_WORLD.allgather(sorted(ranks) if ps.mpi_comm != mpi.COMM_NULL else None)
    for candidate in gathered:
        if candidate is not None:
            return list(candidate)
    raise InvalidArgumentError("A communicator-based process set has no members.")
