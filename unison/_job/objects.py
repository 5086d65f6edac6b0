"""Python objects across ranks (pickled; only for the job's own, mutually trusted processes) and dynamic process sets."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, InvalidArgumentError, UnisonNotImplementedError
from ..ops import CollectiveKind
from ..process_sets import ProcessSet, bind, global_process_set, unbind
from .collectives import allgather, broadcast
from .runtime import job
from .submit import control

__all__ = ["add_process_set", "allgather_object", "broadcast_object", "process_set_of", "registered_set_of", "remove_process_set"]


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return `root_rank`'s `obj` on every rank of the set (pickled by the root).

    The bytes travel over the job's MPI communicator between its own processes; unpickling runs
    code named by the data, so never use this with processes you do not trust.

    Example:
        >>> config = hvd.broadcast_object({"lr": 0.1} if hvd.rank() == 0 else None)   # doctest: +SKIP
    """
    current = job()
    # Not type(obj).__name__ (Horovod's default): non-root ranks usually pass None, so the names
    # would differ across ranks and the broadcast would never match. Call order is the same everywhere.
    set_id = process_set.process_set_id or 0
    if name is None:
        current.check_unnamed_thread("broadcast_object")
        name = f"broadcast_object.{set_id}.{current.next_name_index(set_id)}"
    if current.rank == root_rank:
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload = np.empty(0, dtype=np.uint8)
        length = np.zeros(1, dtype=np.int64)
    length = broadcast(length, root_rank, name=f"{name}.sz", process_set=process_set)
    if current.rank != root_rank:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    data = broadcast(payload, root_rank, name=f"{name}.t", process_set=process_set)
    if current.rank == root_rank:
        return obj
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return the list of every set member's `obj`, in set-rank order (pickled; trusted peers only)."""
    current = job()
    set_id = process_set.process_set_id or 0
    if name is None:
        current.check_unnamed_thread("allgather_object")
        name = f"allgather_object.{set_id}.{current.next_name_index(set_id)}"
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([payload.size], dtype=np.int64), name=f"{name}.sz",
                      process_set=process_set)
    data = allgather(payload, name=f"{name}.t", process_set=process_set)
    out, offset = [], 0
    for size in sizes.tolist():
        out.append(pickle.loads(data[offset : offset + size].tobytes()))
        offset += size
    return out


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set on every rank (collective: all ranks call it, in the same order).

    Needs ``init(process_sets="dynamic")`` or ``UNISON_DYNAMIC_PROCESS_SETS=1``.
    """
    current = job()
    if not current.settings.dynamic_process_sets:
        raise ConfigError(
            "Set UNISON_DYNAMIC_PROCESS_SETS=1 (or call init(process_sets='dynamic')) to allow adding "
            "process sets after initialization."
        )
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.mpi_comm is not None:
        raise UnisonNotImplementedError(
            "Communicator-based process sets can only be registered at init(process_sets=[...])."
        )
    assert ps.ranks is not None
    for existing in current.registered_sets().values():
        if tuple(existing) == tuple(ps.ranks):
            raise InvalidArgumentError(f"Attempted to add a duplicate process set: {ps}")
    return _register(ps)


def process_set_of(ranks: Sequence[int]) -> ProcessSet:
    """The registered process set of exactly `ranks`, registered now if there is none.

    Collective over every rank, in the same order, like `add_process_set`, but needs no dynamic
    process sets: it serves callers whose own contract is collective (torch's ``dist.new_group``).
    """
    wanted = sorted(int(r) for r in ranks)
    if wanted == list(range(job().size)):
        return global_process_set
    found = registered_set_of(wanted)
    return found if found is not None else _register(ProcessSet(wanted))


def registered_set_of(ranks: Sequence[int]) -> ProcessSet | None:
    """The registered process set whose members are exactly `ranks` (in that order), or None."""
    current = job()
    wanted = tuple(int(r) for r in ranks)
    for set_id, members in current.registered_sets().items():
        if tuple(members) == wanted and set_id in current.process_sets:
            return current.process_sets[set_id]
    return None


def _register(ps: ProcessSet) -> ProcessSet:
    current = job()
    assert ps.ranks is not None
    set_id = control(CollectiveKind.ADD_PROCESS_SET, f"add_process_set.{current.next_name_index(0)}",
                      ranks=ps.ranks, target_set=0)
    bind(ps, int(set_id), list(ps.ranks), current.rank)
    current.process_sets[int(set_id)] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank (collective). Returns False for the global set or an
    unregistered one."""
    current = job()
    if not current.settings.dynamic_process_sets:
        raise ConfigError(
            "Set UNISON_DYNAMIC_PROCESS_SETS=1 (or call init(process_sets='dynamic')) to allow removing "
            "process sets after initialization."
        )
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0 or current.set_members(set_id) is None:
        return False
    control(CollectiveKind.REMOVE_PROCESS_SET, f"remove_process_set.{current.next_name_index(0)}",
             target_set=set_id)
    current.process_sets.pop(set_id, None)
    unbind(process_set)
    return True
