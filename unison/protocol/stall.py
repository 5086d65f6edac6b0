"""The stall inspector: decides when tensors that only some ranks submitted deserve a report.

Pure logic, in the style of the rest of the protocol: the engine (rank 0) calls `observe` with the
current time and the tensors that some but not all expected ranks have submitted; the inspector
returns a `StallReport` when one is due and the engine logs it, or stops the job when the report
says ``shutdown``. Nothing here does I/O or reads the clock.

When reports are due:

* The first warning comes once some tensor has been pending ``check_seconds``.
* Later warnings back off exponentially: the next one is due twice the previous gap after the
  previous warning (``check``, then ``+2*check``, ``+4*check``... when observed on time), so a long
  stall gives a handful of reports instead of one a minute. Once nothing has been pending for
  ``check_seconds`` any more, the stall is over and the next one starts again at ``check_seconds``.
* A shutdown report (``shutdown=True``) is returned at every observation where some tensor has been
  pending ``shutdown_seconds`` (when that is not 0), regardless of the backoff.
* A deadlock report (``shutdown=True``, ``deadlock=True``) is returned as soon as every rank missing
  from a pending tensor is itself blocked (its main thread waits in unison with nothing left to send,
  `unison.protocol.cycle.FLAG_BLOCKED`), with the same tensors pending, the same ranks blocked and
  each of those ranks in the same wait (`Place.wait_number`, where places are given), for
  ``deadlock_seconds``. Then no pending tensor can ever complete: each waits for a rank that
  waits in turn, and a blocked rank submits nothing until its wait ends. Waiting for the stall
  shutdown would only add minutes; the window covers a wait that ends in the very cycle it was seen,
  and a program whose other threads submit while the main thread waits (0 turns the check off).

Where each rank is: `observe` may be given every rank's place (`unison.protocol.places.Place`: where
its main thread is, the collective it waits for there, that collective's site, its stack) and the
names' sites (``train.py:41 in step (DDP bucket 0)``). A report then says, for each rank it names,
where its main thread is or waits, names a collective by what made it where that is known (DDP bucket
0), and, with ``show_stacks`` (``UNISON_STALL_STACKS``), lists each named rank's stack.

Example:
    >>> inspector = StallInspector(check_seconds=60, shutdown_seconds=600)
    >>> pending = {"allreduce.x": (frozenset({0}), frozenset({0, 1}))}
    >>> inspector.observe(0.0, pending) is None
    True
    >>> print(inspector.observe(60.0, pending).text.splitlines()[1])
      rank 1 has not submitted: allreduce.x (waiting 60.0 s, submitted by ranks [0])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from ..errors import ConfigError
from .names import split_name, unnamed_index
from .places import Place, origin_of

__all__ = ["DEADLOCK_TITLE", "STALL_TITLE", "StallInspector", "StallReport", "StallStatistics"]

_SHUTDOWN_VARIABLE = "UNISON_STALL_SHUTDOWN_TIME_SECONDS"
_CHECK_VARIABLE = "UNISON_STALL_CHECK_TIME_SECONDS"
_DEADLOCK_VARIABLE = "UNISON_DEADLOCK_SECONDS"
DEADLOCK_TITLE = "Deadlock:"  # how a deadlock report starts (the StallError every rank raises carries it)
STALL_TITLE = "Stall:"  # how a stall report starts


@dataclasses.dataclass(frozen=True)
class StallReport:
    """What the inspector found: the stalled tensors and the text to log.

    Attributes:
        waiting: one entry per tensor pending at least ``check_seconds``, longest first (ties by
            name): (tensor name, ranks that submitted it, ranks missing, seconds pending), the rank
            tuples sorted.
        shutdown: some tensor has been pending at least ``shutdown_seconds``, or the ranks are
            deadlocked; the job must stop.
        text: the human-readable report, one line per missing rank.
        deadlock: every rank the pending tensors wait for is blocked in unison (``waiting`` then
            lists every pending tensor, however long it has waited).
    """

    waiting: tuple[tuple[str, tuple[int, ...], tuple[int, ...], float], ...]
    shutdown: bool
    text: str
    deadlock: bool = False


@dataclasses.dataclass(frozen=True)
class StallStatistics:
    """Counters of a `StallInspector` (tracked and stalled as of its latest observation)."""

    observations: int
    warnings: int
    shutdown_reports: int
    tensors_tracked: int
    tensors_stalled: int
    longest_pending_seconds: float


class StallInspector:
    """Track how long tensors have waited for missing ranks, and say when to warn or stop.

    Args:
        check_seconds: warn once a tensor has been pending this long (> 0).
        shutdown_seconds: stop the job once a tensor has been pending this long; 0 never stops,
            otherwise at least `check_seconds`.
        max_names_per_rank: tensor names listed per missing rank before ``... and N more``.
        deadlock_seconds: stop the job once the ranks have been deadlocked this long (see the module
            docstring); 0 turns the check off.

    Raises:
        ConfigError: a value is out of range; the message gives the values.
    """

    def __init__(
        self,
        check_seconds: float = 60.0,
        shutdown_seconds: float = 600.0,
        max_names_per_rank: int = 6,
        deadlock_seconds: float = 0.0,
    ) -> None:
        if not (check_seconds > 0 and math.isfinite(check_seconds)):
            raise ConfigError(
                f"The stall check time must be a positive number of seconds ({_CHECK_VARIABLE}). "
                f"Got check_seconds={check_seconds!r}."
            )
        if not (
            shutdown_seconds == 0
            or (shutdown_seconds >= check_seconds and math.isfinite(shutdown_seconds))
        ):
            raise ConfigError(
                f"The stall shutdown time must be 0 (never stop) or at least the stall check time "
                f"({_SHUTDOWN_VARIABLE} >= {_CHECK_VARIABLE}). Got shutdown_seconds="
                f"{shutdown_seconds!r} with check_seconds={check_seconds!r}."
            )
        if not (isinstance(max_names_per_rank, int) and max_names_per_rank >= 1):
            raise ConfigError(
                "max_names_per_rank must be an integer >= 1. "
                f"Got max_names_per_rank={max_names_per_rank!r}."
            )
        if not (deadlock_seconds >= 0 and math.isfinite(deadlock_seconds)):
            raise ConfigError(
                f"The deadlock time must be 0 (no check) or a positive number of seconds "
                f"({_DEADLOCK_VARIABLE}). Got deadlock_seconds={deadlock_seconds!r}."
            )
        self._deadlock_seconds = float(deadlock_seconds)
        self._deadlock_state: tuple[frozenset[str], frozenset[int], frozenset[tuple[int, int]]] | None = None
        self._deadlock_since = 0.0
        self._check_seconds = float(check_seconds)
        self._shutdown_seconds = float(shutdown_seconds)
        self._max_names = max_names_per_rank
        self._first_seen: dict[str, float] = {}
        self._last_warning: float | None = None  # time of the latest warning of the current stall
        self._next_warning: float | None = None  # when the next warning of this stall is due
        self._longest_seconds = 0.0
        self._stalled = 0
        self._observations = 0
        self._warnings = 0
        self._shutdown_reports = 0
        self._places: Mapping[int, Place] = {}
        self._sites: Mapping[str, str] = {}
        self._blocked: frozenset[int] = frozenset()
        self.show_stacks = False

    @property
    def check_seconds(self) -> float:
        """Seconds a tensor may be pending before a warning."""
        return self._check_seconds

    @property
    def shutdown_seconds(self) -> float:
        """Seconds a tensor may be pending before the job stops; 0 means never."""
        return self._shutdown_seconds

    def __repr__(self) -> str:
        return (
            f"<StallInspector check_seconds={self._check_seconds:g} "
            f"shutdown_seconds={self._shutdown_seconds:g} tracked={len(self._first_seen)} "
            f"stalled={self._stalled} warnings={self._warnings}>"
        )

    def observe(
        self,
        now: float,
        pending: Mapping[str, tuple[frozenset[int], frozenset[int]]],
        blocked: frozenset[int] = frozenset(),
        places: Mapping[int, Place] | None = None,
        sites: Mapping[str, str] | None = None,
    ) -> StallReport | None:
        """Record the tensors pending at `now` and return a report if one is due.

        Args:
            now: the current time in seconds (any origin, non-decreasing between calls).
            pending: tensor name -> (ranks that submitted it, ranks expected to submit it), for every
                tensor some but not all expected ranks have submitted. Names missing here are
                forgotten: they completed.
            blocked: the ranks blocked in unison this cycle (`unison.protocol.cycle.blocked_ranks`).
            places: rank -> where it is now, for the ranks that said (a report names them).
            sites: tensor name -> where it was called (`unison.protocol.messages.Request.site`).

        Returns:
            A `StallReport` when a warning or a shutdown is due, else None.
        """
        now = float(now)
        self._places, self._sites, self._blocked = places or {}, sites or {}, blocked
        self._observations += 1
        first_seen = self._first_seen
        self._first_seen = {name: first_seen.get(name, now) for name in pending}
        incomplete: list[tuple[str, tuple[int, ...], tuple[int, ...], float]] = []  # some rank missing
        longest = 0.0
        for name, (submitted, expected) in pending.items():
            seconds = max(0.0, now - self._first_seen[name])
            longest = max(longest, seconds)
            missing = expected - submitted
            if missing:
                incomplete.append((name, tuple(sorted(submitted)), tuple(sorted(missing)), seconds))
        self._longest_seconds = longest
        incomplete.sort(key=lambda entry: (-entry[3], entry[0]))
        if self._deadlocked(now, incomplete, blocked):
            deadlock = tuple(incomplete)
            self._stalled = len(deadlock)
            self._shutdown_reports += 1
            return StallReport(deadlock, True, self._deadlock_text(deadlock), deadlock=True)
        stalled = [entry for entry in incomplete if entry[3] >= self._check_seconds]
        self._stalled = len(stalled)
        if not stalled:
            # The stall is over: the next one gets its first warning after check_seconds again.
            self._last_warning = self._next_warning = None
            return None
        shutdown = 0 < self._shutdown_seconds <= stalled[0][3]
        if shutdown:
            self._shutdown_reports += 1
        elif self._next_warning is not None and now < self._next_warning:
            return None
        else:
            gap = self._check_seconds if self._last_warning is None else now - self._last_warning
            self._last_warning = now
            self._next_warning = now + 2.0 * gap
            self._warnings += 1
        waiting = tuple(stalled)
        return StallReport(waiting, shutdown, self._text(waiting, shutdown))

    def _deadlocked(self, now: float, incomplete: list[tuple[str, tuple[int, ...], tuple[int, ...], float]],
                    blocked: frozenset[int]) -> bool:
        """True once every rank missing from an incomplete tensor has been blocked, with the same
        tensors incomplete, the same ranks blocked and each missing rank's main thread in the same wait
        (its place's `wait_number`, where it said), for `deadlock_seconds`. A missing rank whose main
        thread finished a call in between (a loop of collectives in a process set the pending one's
        other members are not in, or beside an asynchronous call it has yet to submit) is not stuck:
        seen blocked each time, it was blocked in a new wait each time."""
        if not self._deadlock_seconds or not incomplete or not blocked or \
                any(not blocked.issuperset(missing) for _, _, missing, _ in incomplete):
            self._deadlock_state = None
            return False
        missing_ranks = {rank for _, _, missing, _ in incomplete for rank in missing}
        places = self._places
        waits = frozenset((rank, places[rank].wait_number) for rank in missing_ranks if rank in places)
        state = (frozenset(name for name, _, _, _ in incomplete), blocked, waits)
        if state != self._deadlock_state:
            self._deadlock_state, self._deadlock_since = state, now
        return now - self._deadlock_since >= self._deadlock_seconds

    def _deadlock_text(self, waiting: tuple[tuple[str, tuple[int, ...], tuple[int, ...], float], ...]) -> str:
        submitted_by: dict[int, list[str]] = {}
        missing_from: dict[int, list[str]] = {}
        for name, submitted, missing, _ in waiting:
            for rank in submitted:
                submitted_by.setdefault(rank, []).append(name)
            for rank in missing:
                missing_from.setdefault(rank, []).append(name)
        lines = [
            f"{DEADLOCK_TITLE} every rank that the pending collectives wait for is itself blocked in unison "
            "(its main thread waits for a collective and it has nothing left to submit), so none of "
            "them can ever run:"
        ]
        named = sorted(set(submitted_by) | set(missing_from))
        for rank in named:
            parts = []
            if rank in submitted_by:
                parts.append(f"waits for {self._names(submitted_by[rank])}")
            if rank in missing_from:
                parts.append(f"has not submitted {self._names(missing_from[rank])}")
            whereabouts = self._whereabouts(rank)
            if whereabouts:
                parts.append(whereabouts)
            lines.append(f"  rank {rank} {'; '.join(parts)}")
        lines += self._stacks(named)
        lines.append(
            f"Stopping the job: they stayed so for {self._deadlock_seconds:g} s ({_DEADLOCK_VARIABLE}; "
            "0 turns this check off). A collective that only some ranks call (a metric under "
            "`if rank == 0:`, a branch on local data, an exception caught on one rank) is the usual "
            "cause: call it on every rank, in the same order."
        )
        return "\n".join(lines)

    def _names(self, names: list[str]) -> str:
        shown = ", ".join(_described(name, origin_of(self._sites.get(name, ""))) for name in names[: self._max_names])
        more = len(names) - self._max_names
        return shown + (f", ... and {more} more" if more > 0 else "")

    def _place(self, rank: int) -> tuple[bool, str] | None:
        """(whether `rank`'s main thread waits in unison, where it is) when `rank` said, else None."""
        place = self._places.get(rank)
        if place is None or not place.where:
            return None
        return bool(place.waits) or rank in self._blocked, place.where

    def _whereabouts(self, rank: int) -> str:
        """'its main thread waits at train.py:41 in step (DDP bucket 0)', '... is at ...', or ''."""
        found = self._place(rank)
        if found is None:
            return ""
        waits, where = found
        return f"its main thread {'waits' if waits else 'is'} at {where}"

    def _submitters(self, ranks: list[int]) -> list[str]:
        """A line per place of the ranks that submitted what others have not, ranks of one place
        together: '  ranks [0, 2-5]: their main threads wait at train.py:41 in step'."""
        by_place: dict[tuple[bool, str], list[int]] = {}
        for rank in ranks:
            found = self._place(rank)
            if found is not None:
                by_place.setdefault(found, []).append(rank)
        lines = []
        for (waits, where), together in by_place.items():
            if len(together) == 1:
                lines.append(f"  rank {together[0]}: its main thread {'waits' if waits else 'is'} at {where}")
            else:
                lines.append(f"  ranks {_format_ranks(together)}: their main threads {'wait' if waits else 'are'} "
                             f"at {where}")
        return lines

    def _stacks(self, ranks: list[int]) -> list[str]:
        """With `show_stacks`: each named rank's main-thread stack, innermost first."""
        if not self.show_stacks:
            return []
        lines = []
        for rank in ranks:
            place = self._places.get(rank)
            if place is not None and place.stack:
                lines.append(f"  rank {rank}'s main thread, innermost frame first:")
                lines += [f"    {frame}" for frame in place.stack]
        return lines

    def statistics(self) -> StallStatistics:
        """Return counters: observations, warnings and shutdown reports issued, tensors tracked and
        stalled at the latest observation, and the longest time one of them had been pending."""
        return StallStatistics(
            observations=self._observations,
            warnings=self._warnings,
            shutdown_reports=self._shutdown_reports,
            tensors_tracked=len(self._first_seen),
            tensors_stalled=self._stalled,
            longest_pending_seconds=self._longest_seconds,
        )

    def _text(
        self,
        waiting: tuple[tuple[str, tuple[int, ...], tuple[int, ...], float], ...],
        shutdown: bool,
    ) -> str:
        count = len(waiting)
        lines = [
            (
                f"{STALL_TITLE} {count} {'tensor has' if count == 1 else 'tensors have'} waited more than "
                f"{self._check_seconds:g} s for ranks that have not submitted "
                f"{'it' if count == 1 else 'them'} (this may mean ranks run different code paths "
                "or one rank is stuck):"
            )
        ]
        by_rank: dict[int, list[tuple[str, tuple[int, ...], float]]] = {}
        for name, submitted, missing, seconds in waiting:  # longest first, so each list is too
            for rank in missing:
                by_rank.setdefault(rank, []).append((name, submitted, seconds))
        for rank in sorted(by_rank):
            entries = by_rank[rank]
            name, submitted, seconds = entries[0]
            origin = origin_of(self._sites.get(name, ""))
            shown = [
                f"{name} ({origin + '; ' if origin else ''}waiting {seconds:.1f} s, submitted by ranks "
                f"{_format_ranks(submitted)})"
            ]
            shown.extend(_described(entry[0], origin_of(self._sites.get(entry[0], "")))
                         for entry in entries[1 : self._max_names])
            more = len(entries) - self._max_names
            tail = f", ... and {more} more" if more > 0 else ""
            whereabouts = self._whereabouts(rank)
            lines.append(f"  rank {rank} has not submitted: {', '.join(shown)}{tail}"
                         + (f"; {whereabouts}" if whereabouts else ""))
        submitters = sorted({rank for _, submitted, _, _ in waiting for rank in submitted} - set(by_rank))
        lines += self._submitters(submitters)
        lines += self._stacks(sorted(set(by_rank) | set(submitters)))
        if shutdown:
            stopped = sorted(
                {rank for _, _, missing, seconds in waiting if seconds >= self._shutdown_seconds
                 for rank in missing}
            )
            lines.append(
                f"Stopping the job: rank(s) {_format_ranks(stopped)} stalled for more than "
                f"{self._shutdown_seconds:g} s ({_SHUTDOWN_VARIABLE})."
            )
        elif self._shutdown_seconds > 0:
            lines.append(
                f"The job will stop if this lasts {self._shutdown_seconds:g} s "
                f"({_SHUTDOWN_VARIABLE}); 0 disables."
            )
        else:
            lines.append(
                f"The job will not be stopped ({_SHUTDOWN_VARIABLE}=0); set it to stop a stalled "
                "job with an error on every rank."
            )
        return "\n".join(lines)


def _described(name: str, origin: str = "") -> str:
    """A tensor name, with what an unnamed one is and what made it where known:
    'allreduce.noname.3 (unnamed allreduce #3)', 'allreduce.torch.pg.p16.2 (DDP bucket 0)'."""
    kind, rest = split_name(name)
    index = unnamed_index(rest)
    notes = ([] if index is None else [f"unnamed {kind} #{index}"]) + ([origin] if origin else [])
    return f"{name} ({', '.join(notes)})" if notes else name


def _format_ranks(ranks: Iterable[int]) -> str:
    """Format sorted ranks as ``[0, 2, 5-9]``: runs of three or more collapse to a range."""
    ordered = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
            i = j + 1
        else:
            parts.append(str(ordered[i]))
            i += 1
    return "[" + ", ".join(parts) + "]"
