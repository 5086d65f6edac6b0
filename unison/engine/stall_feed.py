"""Rank 0's stall feed: once a second, what is pending and who is blocked, handed to the stall inspector.

The inspector (`unison.protocol.stall.StallInspector`) decides from plain data; the feed, which the
cycles hand their votes (`voted`), gathers that data on rank 0: the coordinator's table of tensors some ranks have
submitted, the cached tensors some ranks vote for and others not (from the vote matrix), and the
ranks whose main thread is blocked in unison. A warning is logged; a report that stops the job is
logged and handed to `stop`, which makes the engine broadcast it to every rank.

A steady-state cycle reduces a summary and gathers no rows (`unison.engine.status`). When a check is
due and nothing waits (no rank waits in the cache, none is blocked, the coordinator's table is empty),
there is nothing to report; otherwise the feed asks for a detail cycle (`voted` returns True) and
checks with what it gathers: every rank's row and every rank's place (where its main thread is, the
collective it waits for and where that was called: `unison.protocol.places`), so that a report names
where each rank it names is. Per-rank detail costs two gathers once a period, and only while something
waits; the names' sites come from the coordinator's table and from the places.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from ..protocol.cache import ResponseCache
from ..protocol.cycle import FLAG_BLOCKED, Summary, Votes, blocked_ranks, cached_waits
from ..protocol.negotiation import Coordinator
from ..protocol.places import Place, read_place
from ..protocol.stall import StallInspector

__all__ = ["PERIOD_SECONDS", "StallFeed"]

log = logging.getLogger(__name__)

PERIOD_SECONDS = 1.0
"""How often the feed asks the inspector (at most once a cycle)."""

_NO_VOTES = Votes((), frozenset(), 0, 0)


class StallFeed:
    """Feed rank 0's stall inspector from each cycle's votes (the engine calls `voted` each cycle).

    Args:
        inspector: decides when to warn or stop.
        coordinator: rank 0's coordinator (its pending table).
        cache: this rank's response cache (the names behind the voted slots).
        process_sets: set id -> members, the engine's own dict (it changes as sets are added).
        stop: called with a report's text when the job must stop.

    Attributes:
        places_of: takes every rank's place row of the latest detail cycle (`StatusExchange.take_places`),
            None when that cycle gathered none; the cycles set it. Unset, the feed checks with the rows
            alone, and reports name no rank's place.
    """

    def __init__(self, inspector: StallInspector, coordinator: Coordinator, cache: ResponseCache,
                 process_sets: Mapping[int, tuple[int, ...]], stop: Callable[[str], None]) -> None:
        self.inspector = inspector
        self._coordinator = coordinator
        self._cache = cache
        self._process_sets = process_sets
        self._stop = stop
        self._last_check = 0.0
        self.places_of: Callable[[], list[bytes] | None] | None = None

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
        places = None if self.places_of is None else self.places_of()
        if matrix is not None and votes is not None and (places is not None or self.places_of is None):
            self._last_check = now
            self.check(now, votes, blocked_ranks(matrix), places)
            return False
        if summary.waiting or summary.flags & FLAG_BLOCKED or (
                self.places_of is not None and self._coordinator.has_pending()):
            return True  # something waits: look with every rank's row (and place)
        self._last_check = now
        self.check(now, _NO_VOTES, frozenset())
        return False

    def check(self, now: float, votes: Votes, blocked: frozenset[int], places: list[bytes] | None = None) -> None:
        """Hand the inspector what is pending now and where each rank is (`places`: every rank's place row);
        log its report and stop the job if it says so."""
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
        read: dict[int, Place] = {}
        for rank, row in enumerate(places or ()):
            place = read_place(row)
            if place is not None:
                read[rank] = place
        sites = {place.waits: place.site for place in read.values() if place.waits and place.site}
        sites.update(self._coordinator.sites())
        report = self.inspector.observe(now, pending, blocked, read, sites)
        if report is None:
            return
        if report.shutdown:
            log.error("%s", report.text, extra={"unison_stop_report": True})  # under unisonrun, it prints it
            self._stop(report.text)
        else:
            log.warning("%s", report.text)
