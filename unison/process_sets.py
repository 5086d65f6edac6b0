"""Process sets: named subsets of the job's ranks that run collectives among themselves."""

from __future__ import annotations

from typing import Any

__all__ = ["ProcessSet", "global_process_set"]


class ProcessSet:
    """A subset of global ranks (a sorted list) or an mpi4py communicator, registered with the job.

    Collectives take ``process_set=``; broadcast roots stay *global* ranks. A set is usable once it is
    registered, at `init(process_sets=[...])` or with `add_process_set`.

    Example:
        >>> evens = ProcessSet([0, 2])
        >>> evens.ranks, evens.process_set_id
        ([0, 2], None)
    """

    def __init__(self, ranks_or_comm: Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks: list[int] | None = None
        else:
            ranks = sorted(int(r) for r in ranks_or_comm)
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"A process set's ranks must be distinct. Got {list(ranks_or_comm)}.")
            self.ranks = ranks
        self._rank: int | None = None  # this process's global rank, set at registration

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return (self.process_set_id, self.ranks) == (other.process_set_id, other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def size(self) -> int | None:
        """Number of ranks in the set (None before its ranks are known)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank inside the set; None if unregistered or not a member."""
        if self.process_set_id is None or self.ranks is None or self._rank not in self.ranks:
            return None
        return self.ranks.index(self._rank)

    def included(self) -> bool | None:
        """Whether this process belongs to the set; None while unregistered."""
        if self.process_set_id is None or self.ranks is None:
            return None
        return self._rank in self.ranks



def bind(process_set: ProcessSet, process_set_id: int, ranks: list[int], my_rank: int) -> None:
    """Record that `process_set` is registered as `process_set_id` with these global ranks (the runtime's
    step at init and at `add_process_set`; not part of the public API)."""
    process_set.process_set_id = process_set_id
    process_set.ranks = sorted(ranks)
    process_set._rank = my_rank


def unbind(process_set: ProcessSet) -> None:
    """Record that `process_set` is no longer registered (at shutdown or `remove_process_set`)."""
    process_set.process_set_id = None
    process_set._rank = None


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
