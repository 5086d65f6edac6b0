"""What a parameter server knows of its trainers: when each was heard, who finished, who is lost, who was told a step failed.

The rules themselves are `_steps`' pure functions; a `Roster` keeps what they read and reads the time
from `clock`, so a test moves it by hand. It holds no lock: the server calls it under its own.

Example:
    >>> now = [100.0]
    >>> roster = Roster(0, 2, sync=False, timeout_seconds=5.0, clock=lambda: now[0])
    >>> roster.seen(0, host="a", pid=10); roster.seen(1, host="b", pid=11)
    >>> now[0] = 104.0; roster.finish(0)
    1
    >>> now[0] = 107.0; roster.end_reason()
    'trainer 0 finished; trainer 1 (b, pid 11) sent nothing for 7.0 s; it died or is stopped'
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Set
from typing import Any

from ..errors import RequestError, TrainerLostError
from ._steps import TrainerSeen, lost_trainers, server_end, step_blockers

__all__ = ["Roster"]


class Roster:
    """The trainers of one server's job, as the server has heard from them.

    Args:
        server: the server's index (named in messages).
        num_trainers: trainers of the job.
        sync: synchronous mode (a step that fails, failing the trainers' later calls).
        timeout_seconds: a trainer not heard for this long is gone.
        clock: seconds of a monotonic clock.
    """

    def __init__(self, server: int, num_trainers: int, *, sync: bool, timeout_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.server, self.num_trainers, self.sync = server, num_trainers, sync
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self.trainers: dict[int, TrainerSeen] = {}
        self.failure = ""  # synchronous mode: the step that failed, with the trainer lost
        self.told: set[int] = set()  # trainers that got `failure`

    def __repr__(self) -> str:
        finished = sum(1 for s in self.trainers.values() if s.finished)
        return f"<Roster of server {self.server}: {len(self.trainers)}/{self.num_trainers} seen, {finished} finished>"

    def check(self, trainer: int) -> int:
        """`trainer`, once it is in range(num_trainers)."""
        if not 0 <= trainer < self.num_trainers:
            raise RequestError(f"trainer must be in range(num_trainers={self.num_trainers}). Got trainer={trainer}.")
        return trainer

    def seen(self, trainer: int, **changes: Any) -> None:
        """Note that `trainer` was heard from now, with `changes` to what is known of it (`TrainerSeen`'s fields)."""
        seen = self.trainers.get(trainer, TrainerSeen())
        now = self.clock()
        self.trainers[trainer] = dataclasses.replace(seen, last_seen=now, first_seen=seen.first_seen or now,
                                                     **changes)

    def heartbeat(self, trainer: int) -> None:
        """Note that `trainer` is alive."""
        self.seen(self.check(trainer))

    def finish(self, trainer: int) -> int:
        """Note that `trainer` finished; return how many have."""
        self.seen(self.check(trainer), finished=True)
        return sum(1 for s in self.trainers.values() if s.finished)

    def lost(self, now: float | None = None) -> dict[int, str]:
        """The trainers that did not finish and are gone, with why (`_steps.lost_trainers`)."""
        now = self.clock() if now is None else now
        return lost_trainers(self.trainers, self.num_trainers, now, self.timeout_seconds, self.sync)

    def end_reason(self, now: float | None = None) -> str:
        """Why the server's work is over, or "" while a trainer may still need it (`_steps.server_end`)."""
        now = self.clock() if now is None else now
        return server_end(sync=self.sync, trainers=self.trainers, num_trainers=self.num_trainers, now=now,
                          timeout_seconds=self.timeout_seconds, failure=self.failure, told=self.told)

    def blockers(self, step: int, contributors: Set[int]) -> list[str]:
        """Why synchronous step `step` cannot complete: each trainer missing from `contributors` that is gone."""
        return step_blockers(step, contributors, self.trainers, self.num_trainers, self.clock(), self.timeout_seconds)

    def fail(self, trainer: int, failure: str) -> None:
        """Keep `failure` (unless one is kept already) as the end of synchronous training; `trainer` was told it."""
        self.failure = self.failure or failure
        self.told.add(trainer)

    def check_failure(self, trainer: int) -> None:
        """After a failed synchronous step, answer every call of `trainer` with the failure (it is told)."""
        if self.failure:
            self.told.add(trainer)
            raise TrainerLostError(self.failure)

    def statistics(self, now: float | None = None) -> dict[str, Any]:
        """Each trainer as last heard, the lost ones with why, and the failure."""
        now = self.clock() if now is None else now
        lost = self.lost(now)
        return {
            "trainers": {str(t): {"host": s.host, "pid": s.pid, "pushed": s.pushed, "finished": s.finished,
                                  "seconds_since_seen": round(now - s.last_seen, 3), "lost": lost.get(t, "")}
                         for t, s in sorted(self.trainers.items())},
            "lost_trainers": {str(t): why for t, why in sorted(lost.items())},
            "failure": self.failure,
        }
