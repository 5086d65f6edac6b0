"""When a parameter server's work is over: a thread watching its trainers, naming the lost ones, ending the work.

The rule is `_steps.server_end`, read through the shard's `Roster`; this module applies it as time
passes and after the calls that change its answer (a trainer finished, or was told that a step
failed), and logs each trainer counted lost and each heard from again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..rpc.heartbeat import every
from ._roster import Roster
from ._steps import EVERY_TRAINER_FINISHED

__all__ = ["Liveness"]

log = logging.getLogger(__name__)

_CHECK_SECONDS = 0.25


class Liveness:
    """Decide, under the server's lock, when its work is over; `finished` is set then and `reason` says why.

    Args:
        server: the server's index (named in the log).
        roster: its trainers.
        changed: the server's lock, as the condition that waiting calls wait on (woken at the end).
    """

    def __init__(self, server: int, roster: Roster, changed: threading.Condition) -> None:
        self.server = server
        self.roster = roster
        self.finished = threading.Event()
        self.reason = ""  # why the server's work is over (`Roster.end_reason`), once it is
        self._changed = changed
        self._lost_named: set[int] = set()  # trainers logged as lost (and not heard from since)

    def __repr__(self) -> str:
        return f"<Liveness of server {self.server}: {self.reason or 'serving'}, {len(self._lost_named)} lost>"

    def check(self) -> None:
        """(Under the lock.) Log changes in the lost trainers; set `reason` and `finished` once the work is over."""
        if self.finished.is_set():
            return
        now = self.roster.clock()
        lost = self.roster.lost(now)
        for trainer in sorted(set(lost) - self._lost_named):
            log.info("parameter server %d counts %s", self.server, lost[trainer])
        for trainer in sorted(self._lost_named - set(lost)):
            log.info("parameter server %d hears from trainer %d again", self.server, trainer)
        self._lost_named = set(lost)
        reason = self.roster.end_reason(now)
        if reason:
            self.reason = reason
            self.finished.set()
            self._changed.notify_all()

    @property
    def every_trainer_finished(self) -> bool:
        """Whether the work is over because every trainer finished (the end it should have)."""
        return self.reason == EVERY_TRAINER_FINISHED

    def run(self, stopping: threading.Event) -> None:
        """Check every quarter second until the work is over or `stopping` is set (the watching thread's body)."""
        every(_CHECK_SECONDS, stopping, self._beat)

    def _beat(self) -> bool:
        with self._changed:
            self.check()
        return not self.finished.is_set()

    def record(self) -> dict[str, Any]:
        """Why the work ended and which trainers were lost, with their host and pid (for the launcher)."""
        with self._changed:
            seen = self.roster.trainers
            return {"server": self.server, "reason": self.reason,
                    "lost": {str(t): {"host": seen[t].host, "pid": seen[t].pid, "why": why}
                             for t, why in sorted(self.roster.lost().items()) if t in seen}}
