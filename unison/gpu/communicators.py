"""The NCCL communicators of a job: one per process set and device, made on first use, dropped with the set.

The cache decides, from plain data, when a communicator must be made (a collective on a set and
device not seen before), which rank creates the unique id (the set's lowest rank), and which ones go
when a process set is removed. Making one is collective over the set, so every member must reach the
same decision at the same point of the job's single response order, which these rules guarantee: the
key is in the response, never in local state that could differ between ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["CommunicatorCache"]

C = TypeVar("C")


class CommunicatorCache(Generic[C]):
    """Communicators keyed by (process set id, device ordinal), made by `make` on first use.

    Args:
        make: (set id, device, the set's global ranks, this rank's index in the set) -> a communicator;
            collective over the set's members.
        close: releases one communicator (local).

    Example:
        >>> made = []
        >>> cache = CommunicatorCache(lambda s, d, ranks, index: made.append((s, d)) or f"comm{s}.{d}", lambda c: None)
        >>> cache.get(0, 0, (0, 1), rank=1), cache.get(0, 0, (0, 1), rank=1), made
        ('comm0.0', 'comm0.0', [(0, 0)])
    """

    def __init__(self, make: Callable[[int, int, Sequence[int], int], C], close: Callable[[C], None]) -> None:
        self._make = make
        self._close = close
        self._comms: dict[tuple[int, int], C] = {}
        self._stats = {"made": 0, "hits": 0, "closed": 0}

    def __repr__(self) -> str:
        return f"<CommunicatorCache {sorted(self._comms)}>"

    def statistics(self) -> dict[str, int]:
        """Counters: communicators made, lookups answered from the cache, communicators closed."""
        return dict(self._stats, open=len(self._comms))

    def get(self, process_set_id: int, device: int, members: Sequence[int], rank: int) -> C:
        """The communicator of the set on `device`, made now if it is the first use.

        Raises:
            ValueError: `rank` is not a member of the set (a non-member must never reach a set's
                collective: the engine runs a response only on its members).
        """
        key = (process_set_id, device)
        comm = self._comms.get(key)
        if comm is not None:
            self._stats["hits"] += 1
            return comm
        ordered = sorted(members)
        if rank not in ordered:
            raise ValueError(
                f"rank {rank} asked for the communicator of process set {process_set_id}, whose members "
                f"are {ordered}; only members take part in a set's collectives."
            )
        comm = self._make(process_set_id, device, ordered, ordered.index(rank))
        self._comms[key] = comm
        self._stats["made"] += 1
        return comm

    @staticmethod
    def id_maker(members: Sequence[int]) -> int:
        """The rank that creates the set's NCCL unique id and sends it to the others: the lowest."""
        return min(members)

    def drop_set(self, process_set_id: int) -> None:
        """Close every communicator of a removed process set (all its devices)."""
        for key in [k for k in self._comms if k[0] == process_set_id]:
            self._close(self._comms.pop(key))
            self._stats["closed"] += 1

    def close(self) -> None:
        """Close every communicator (at shutdown)."""
        for key in list(self._comms):
            self._close(self._comms.pop(key))
            self._stats["closed"] += 1
