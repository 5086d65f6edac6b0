"""Decide which worker process holds which rank of each membership epoch, and what each worker is told (pure).

In an elastic job whose survivors keep their processes, the driver starts one worker process per slot
and keeps it across epochs for as long as its host stays in the job. Each worker has a name the
driver gave it (``w0``, ``w1``, ...). `assign` gives an epoch's ranks to workers: the surviving
workers of each host keep their order, and the slots left need new workers. `Roster` holds the
running epoch's members and answers the questions workers ask the driver (`answer`): the epoch to
join as which rank, wait (the next epoch is not decided yet), or leave (the job goes on without this
worker). Workers report when they stopped at a commit for a change of hosts (`stopped`) and when a
collective of their epoch failed (`broken`, with the ranks they found lost, if any); the driver ends
the epoch on a failure or once every member stopped. Nothing here runs a process or reads a clock.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from .membership import Epoch

__all__ = ["Assignment", "Leave", "Phase", "Roster", "Wait", "assign"]


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A worker's place in an epoch: join `epoch` as `rank` of `epoch.np`."""

    epoch: Epoch
    rank: int


@dataclasses.dataclass(frozen=True)
class Wait:
    """Ask again: the epoch the worker may join is not decided yet (or is the one it already runs)."""


@dataclasses.dataclass(frozen=True)
class Leave:
    """The job goes on without this worker (its host left or failed, or the job ended): it must stop."""

    why: str


class Phase(enum.Enum):
    """Where the running epoch is."""

    NONE = "none"  # no epoch decided yet
    RUNNING = "running"  # its members train (or are joining)
    ENDED = "ended"  # it failed or every member stopped; the next one is being decided


def assign(epoch: Epoch, survivors: Mapping[str, Sequence[str]]) -> list[str | None]:
    """The worker of each rank of `epoch`: the surviving workers of each host in their order, None
    where a new worker must start. Survivors beyond their host's slots (or of hosts not in the epoch)
    get no rank.

    Example:
        >>> from unison.elastic.membership import Host
        >>> assign(Epoch(1, (Host("a", 2), Host("c", 1))), {"a": ["w0"], "b": ["w1"]})
        ['w0', None, None]
    """
    members: list[str | None] = []
    for host in epoch.hosts:
        kept = list(survivors.get(host.name, ()))[:host.slots]
        members += kept + [None] * (host.slots - len(kept))
    return members


class Roster:
    """The running epoch's members and what each worker that asks is told.

    Example:
        >>> from unison.elastic.membership import Host
        >>> roster = Roster()
        >>> roster.begin(Epoch(0, (Host("a", 2),)), ["w0", "w1"])
        >>> roster.answer("w1", after=-1)
        Assignment(epoch=Epoch(number=0, hosts=(Host(name='a', slots=2),)), rank=1)
        >>> roster.answer("w1", after=0), roster.answer("w7", after=-1)
        (Wait(), Leave(why='not a member of epoch 0'))
    """

    def __init__(self) -> None:
        self.epoch: Epoch | None = None
        self.members: list[str] = []
        self.phase = Phase.NONE
        self.stopped_members: set[str] = set()
        self.broken_reports: dict[str, tuple[int, ...]] = {}  # member -> ranks it found lost
        self.leaving: dict[str, str] = {}  # workers told to leave -> why
        self.joined: set[str] = set()  # members that asked for the running epoch and were told it

    def __repr__(self) -> str:
        number = self.epoch.number if self.epoch is not None else None
        return f"<Roster epoch={number} phase={self.phase.value} members={self.members}>"

    def statistics(self) -> dict[str, int]:
        return {"members": len(self.members), "joined": len(self.joined), "stopped": len(self.stopped_members),
                "broken_reports": len(self.broken_reports), "leaving": len(self.leaving)}

    def begin(self, epoch: Epoch, members: Sequence[str]) -> None:
        """Run `epoch` with `members[rank]` as each rank's worker."""
        if len(members) != epoch.np:
            raise ValueError(f"epoch {epoch.number} has {epoch.np} ranks, but {len(members)} members were given")
        self.epoch, self.members, self.phase = epoch, list(members), Phase.RUNNING
        self.stopped_members, self.broken_reports, self.joined = set(), {}, set()
        for worker in members:
            self.leaving.pop(worker, None)

    def end(self) -> None:
        """The running epoch is over (a failure, or every member stopped): workers that ask now wait."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.ENDED

    def dismiss(self, worker: str, why: str) -> None:
        """Tell `worker` to leave when it asks next."""
        self.leaving[worker] = why

    def rank_of(self, worker: str) -> int | None:
        """`worker`'s rank in the running (or last) epoch, None when it is not a member."""
        return self.members.index(worker) if worker in self.members else None

    def answer(self, worker: str, after: int) -> Assignment | Wait | Leave:
        """What `worker`, which ran epoch `after` last (-1: none yet), is told when it asks for its next epoch."""
        if worker in self.leaving:
            return Leave(self.leaving[worker])
        epoch = self.epoch
        if epoch is None or self.phase is Phase.NONE:
            return Wait()
        if self.phase is Phase.RUNNING and epoch.number > after:
            if worker in self.members:
                self.joined.add(worker)
                return Assignment(epoch, self.members.index(worker))
            return Leave(f"not a member of epoch {epoch.number}")
        return Wait()

    def stopped(self, worker: str, epoch: int) -> None:
        """`worker` committed and stopped for the change of hosts announced to `epoch`."""
        if self._current(worker, epoch):
            self.stopped_members.add(worker)

    def all_stopped(self) -> bool:
        """Every member of the running epoch stopped at its commit for the change of hosts."""
        return self.phase is Phase.RUNNING and bool(self.members) and self.stopped_members >= set(self.members)

    def broken(self, worker: str, epoch: int, lost: Sequence[int]) -> None:
        """A collective of `epoch` failed on `worker`; `lost` are the ranks it found lost (may be empty)."""
        if self._current(worker, epoch):
            self.broken_reports[worker] = tuple(sorted({r for r in lost if 0 <= r < len(self.members)}))

    def lost_workers(self) -> list[str]:
        """The members that reporting members found lost, in rank order (never a reporter itself)."""
        lost = {rank for ranks in self.broken_reports.values() for rank in ranks}
        return [self.members[rank] for rank in sorted(lost) if self.members[rank] not in self.broken_reports]

    def _current(self, worker: str, epoch: int) -> bool:
        return (self.phase is Phase.RUNNING and self.epoch is not None and epoch == self.epoch.number
                and worker in self.members)
