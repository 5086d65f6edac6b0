"""Rank 0's stall feed: once a second, what is pending and who is blocked, handed to the stall inspector.

The inspector (`unison.protocol.stall.StallInspector`) decides from plain data; this observer of the
engine's cycles gathers that data on rank 0: the coordinator's table of tensors some ranks have
submitted, the cached tensors some ranks vote for and others not (from the vote matrix), and the
ranks whose main thread is blocked in unison. A warning is logged; a report that stops the job is
logged and handed to `stop`, which makes the engine broadcast it to every rank.

A steady-state cycle reduces a summary and gathers no rows (`unison.engine.status`). When a check is
due and the summary shows no rank waiting in the cache and none blocked, the coordinator's table is
all there is to check; otherwise the feed asks for the rows of the next cycle (`voted` returns True)
and checks with them: per-rank detail costs a gather once a period, and only while something waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from ..protocol.cache import ResponseCache
from ..protocol.cycle import FLAG_BLOCKED, Summary, Votes, blocked_ranks, cached_waits
from ..protocol.negotiation import Coordinator
from ..protocol.stall import StallInspector
from .observer import Silent

__all__ = ["PERIOD_SECONDS", "StallFeed"]

log = logging.getLogger(__name__)

PERIOD_SECONDS = 1.0
"""How often the feed asks the inspector (at most once a cycle)."""

_NO_VOTES = Votes((), frozenset(), 0, 0)


class StallFeed(Silent):
    """Feed rank 0's stall inspector from each cycle's votes (the engine calls `voted` each cycle).

    Args:
        inspector: decides when to warn or stop.
        coordinator: rank 0's coordinator (its pending table).
        cache: this rank's response cache (the names behind the voted slots).
        process_sets: set id -> members, the engine's own dict (it changes as sets are added).
        stop: called with a report's text when the job must stop.
    """

    def __init__(self, inspector: StallInspector, coordinator: Coordinator, cache: ResponseCache,
                 process_sets: Mapping[int, tuple[int, ...]], stop: Callable[[str], None]) -> None:
        self.inspector = inspector
        self._coordinator = coordinator
        self._cache = cache
        self._process_sets = process_sets
        self._stop = stop
        self._last_check = 0.0

    def __repr__(self) -> str:
        return f"<StallFeed last_check={self._last_check:.1f} inspector={self.inspector!r}>"

    def due(self, now: float) -> bool:
        """Whether a check is due at `now` (`voted` checks only then)."""
        return now - self._last_check >= PERIOD_SECONDS

    def voted(self, now: float, summary: Summary, votes: Votes | None,
              matrix: Sequence[Sequence[int]] | None) -> bool:
        """Once `PERIOD_SECONDS` have passed since the last check, check again; return True to ask for
        every rank's row in the next cycle (the summary alone cannot say who waits or is blocked).

        Args:
            now: the cycle's start (`time.monotonic`).
            summary: the cycle's reduced summary.
            votes: the votes read from `matrix`, when the rows were gathered.
            matrix: every rank's status row, or None when this cycle gathered none.
        """
        if now - self._last_check < PERIOD_SECONDS:
            return False
        if matrix is not None and votes is not None:
            self._last_check = now
            self.check(now, votes, blocked_ranks(matrix))
            return False
        if summary.waiting or summary.flags & FLAG_BLOCKED:
            return True
        self._last_check = now
        self.check(now, _NO_VOTES, frozenset())
        return False

    def check(self, now: float, votes: Votes, blocked: frozenset[int]) -> None:
        """Hand the inspector what is pending now; log its report and stop the job if it says so."""
        pending = {
            name: (submitted, expected)
            for name, (submitted, expected, _) in self._coordinator.pending().items()
        }
        cache, process_sets = self._cache, self._process_sets
        waits = cached_waits(
            votes, cache.slots(),
            lambda slot: process_sets.get(cache.peek(slot).process_set_id, ()),
        )
        for slot, (submitted, expected) in waits.items():
            # a rank may have sent as a request (its cache entry was invalid) the tensor that others
            # wait for in the cache: it did submit it, so both views count
            name = cache.peek(slot).names[0]
            earlier, _ = pending.get(name, (frozenset(), frozenset()))
            pending[name] = (submitted | earlier, expected)
        report = self.inspector.observe(now, pending, blocked)
        if report is None:
            return
        if report.shutdown:
            log.error("%s", report.text)
            self._stop(report.text)
        else:
            log.warning("%s", report.text)
