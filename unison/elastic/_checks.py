"""A State's check for host changes: rank 0 asks the elastic driver, every rank hears it at the same commit.

Rank 0 asks the driver (at most every 0.1 s, inside ``commit()``) how many host changes it announced to
the running epoch, and broadcasts its count without waiting for it; every rank reads that broadcast at
its next check, so all raise `HostsUpdatedInterrupt` at the same commit, one commit after rank 0 heard
of the change (docs/elastic.md: waiting for the broadcast at each commit cost 7% of a step).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import HostsUpdatedInterrupt
from ._books import BOOKS, Books
from ._environment import ask_driver, environment

__all__ = ["HostChecks", "settle_checks"]

_ASK_EVERY_SECONDS = 0.1  # rank 0 asks the driver at most this often; commits in between reuse the answer
_ASK_AFTER_NO_ANSWER_SECONDS = 5.0  # after a question the driver did not answer, wait longer
_UPDATES_NAME = "unison.elastic.host_updates"
# The State whose host check is in flight in this process: the broadcast's one name is used by one
# collective at a time, so a State starting its check first finishes another's (two States committing).
_checking: list[HostChecks] = []


class HostChecks:
    """The host-change check of a State (a mixin: `State` keeps its bookkeeping where `_books` finds it)."""

    @property
    def _books(self) -> Books:
        books: Books = vars(self)[BOOKS]
        return books

    @property
    def _host_messages(self) -> _HostMessages:
        """Horovod's queue of the driver's host messages, as its elastic test scripts read it: ``empty()``
        is False once the driver announced a change of hosts to this epoch (rank 0 asks the driver)."""
        return _HostMessages(self)

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank when the driver announced a host change.

        Rank 0 asks the driver (at most every 0.1 s) and broadcasts its answer without waiting for
        it; every rank reads that broadcast at its next check. The training step in between hides the
        broadcast's latency, every rank still raises at the same call, and a change is acted on one
        check after rank 0 learned of it.
        """
        if not environment().driver:
            return
        seen = self._finish_check()
        if seen > self._books.known_updates:
            self._books.known_updates = seen
            raise HostsUpdatedInterrupt(False)
        self._start_check()

    def _ask_driver(self) -> None:
        """On rank 0, at most every 0.1 s: ask the driver how many host changes it announced to this epoch."""
        env = environment()
        books = self._books
        if books.get_rank() == 0:
            now = time.monotonic()
            if now - books.asked_at >= _ASK_EVERY_SECONDS:
                books.asked_at = now
                answer = ask_driver(env.driver, env.epoch)
                if answer is None:  # no answer (up to 2 s lost): ask again only after a while
                    books.asked_at = now + _ASK_AFTER_NO_ANSWER_SECONDS
                else:
                    books.driver_updates = answer

    def _start_check(self) -> None:
        """Start broadcasting rank 0's count of announced host changes, read by the next check."""
        from .._job.collectives import broadcast_async_

        books = self._books
        self._ask_driver()
        count = np.array([books.driver_updates], dtype=np.int64)
        for other in list(_checking):
            other._resolve_check()
        books.pending_check = (broadcast_async_(count, 0, name=_UPDATES_NAME), count)
        _checking[:] = [self]

    def _take_check(self) -> tuple[int, np.ndarray] | None:
        """This State's check broadcast (handle, buffer), if one runs; no longer in flight for the others."""
        if _checking and _checking[0] is self:
            _checking.clear()
        pending, self._books.pending_check = self._books.pending_check, None
        return pending

    def _resolve_check(self) -> None:
        """Wait for this State's check broadcast, if one runs, and keep its value for the next check."""
        from .._job.submit import synchronize

        pending = self._take_check()
        if pending is not None:
            synchronize(pending[0])
            self._books.checked = int(pending[1][0])

    def _drop_check(self, timeout_seconds: float) -> None:
        """At shutdown: let the check broadcast in flight finish (every rank started it), but wait at
        most `timeout_seconds` and never raise: the job is ending either way."""
        from .._job.submit import release

        pending = self._take_check()
        if pending is not None:
            try:
                release(pending[0], timeout_seconds)
            except Exception:  # noqa: BLE001  (the job already stopped: nothing left to wait for)
                pass

    def _finish_check(self) -> int:
        """Rank 0's count from the previous check (this rank's known count when there was none)."""
        self._resolve_check()
        seen, self._books.checked = self._books.checked, None
        return self._books.known_updates if seen is None else seen

    def _settle(self) -> None:
        """Finish what the last commit left running (the host check's broadcast), on every rank at the end of `run`."""
        self._finish_check()

    def _abandon(self) -> None:
        """After a failed collective: forget the check in flight (its job is gone) without waiting for it."""
        self._take_check()
        _checking.clear()


class _HostMessages:
    """Horovod's ``State._host_messages`` as its elastic test scripts use it: only ``empty()``."""

    def __init__(self, state: HostChecks) -> None:
        self._state = state

    def empty(self) -> bool:
        """False once the driver announced a change of hosts this epoch has not acted on (rank 0 asks it)."""
        books = self._state._books
        if not environment().driver:
            return True
        self._state._ask_driver()
        return books.driver_updates <= books.known_updates

    def qsize(self) -> int:
        return 0 if self.empty() else 1


def settle_checks(timeout_seconds: float = 10.0) -> None:
    """Called by ``shutdown()``: finish the host check a State left in flight, so that no rank leaves
    while another still waits for that broadcast (a `commit()` outside ``hvd.elastic.run``, or a
    ``hvd.shutdown()`` inside it)."""
    for state in list(_checking):
        state._drop_check(timeout_seconds)
