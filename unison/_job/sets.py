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
                  comm: object = None,
                  ) -> tuple[dict[int, tuple[int, ...]], dict[int, ProcessSet], InvalidArgumentError | None]:
    """Register the global set and `process_sets` (checked by `check_process_sets`) on `backend`: the
    table of registered sets, the ProcessSet objects by id, and the error for duplicates (raised after
    the job started, as Horovod does).

    As in Horovod, the global set reports the communicator `init()` was given (`comm`, None for a
    list of ranks or none), and a communicator that differs between ranks (made by ``Split``)
    registers the group of every rank, each rank binding its object to its own group. Duplicates
    are what this rank lists twice (or the global set): another rank's color is not one.
    """
    rank, size = backend.rank, backend.size
    registered = {0: tuple(range(size))}
    sets: dict[int, ProcessSet] = {0: global_process_set}
    bind(global_process_set, 0, list(range(size)), rank)
    global_process_set.mpi_comm = comm if hasattr(comm, "Get_rank") else None
    duplicates: list[tuple[ProcessSet, int]] = []
    bound_here = [tuple(range(size))]  # the groups this rank bound, in its list's order
    for ps in process_sets or []:
        groups, own = _groups_of(ps, mpi)
        for group in groups:
            if _set_id_of(registered, group) is None:
                backend.add_process_set(len(registered), group)
                registered[len(registered)] = tuple(group)
        if own is None:  # COMM_NULL on this rank: the set names no group here
            unbind(ps)
            continue
        known = _set_id_of(registered, own)
        if known is None or tuple(own) in bound_here:
            # Horovod registers the other sets, then raises: the job runs, this object stays
            # unregistered (unless it is the very object registered earlier in the list).
            if sets.get(known or 0) is not ps:
                unbind(ps)
            duplicates.append((ps, known or 0))
            continue
        bind(ps, known, own, rank)
        bound_here.append(tuple(own))
        sets[known] = ps
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


def _groups_of(ps: ProcessSet, mpi: ModuleType | None) -> tuple[list[list[int]], list[int] | None]:
    """A process set's groups of global ranks: every distinct one across the world's ranks (in the
    order of the first world rank that holds it), and this rank's own (None where its communicator
    is COMM_NULL). A list set has one group, the same everywhere (range-checked by
    `check_process_sets`); a communicator made by ``Split`` has one per color."""
    if ps.mpi_comm is None:
        assert ps.ranks is not None
        return [list(ps.ranks)], list(ps.ranks)
    if mpi is None:
        raise UnisonNotImplementedError("Communicator-based process sets need MPI.")
    own: list[int] | None = None
    if ps.mpi_comm != mpi.COMM_NULL:
        group = ps.mpi_comm.Get_group()
        world_group = mpi.COMM_WORLD.Get_group()
        own = sorted(mpi.Group.Translate_ranks(group, list(range(group.Get_size())), world_group))
    groups: list[list[int]] = []
    for candidate in mpi.COMM_WORLD.allgather(own):
        if candidate is not None and list(candidate) not in groups:
            groups.append(list(candidate))
    if not groups:
        raise InvalidArgumentError("A communicator-based process set has no members.")
    return groups, own


def _ranks_of(ps: ProcessSet, mpi: ModuleType | None) -> list[int]:
    """This rank's group of a process set (see `_groups_of`)."""
    _, own = _groups_of(ps, mpi)
    if own is None:
        raise InvalidArgumentError(
            f"{ps} is COMM_NULL on this rank: it names no process set here. Pass the communicator of "
            "the group this rank belongs to."
        )
    return own
