"""What watches the engine's cycles without steering them: the `CycleObserver` protocol and its fan-out.

The loop reports each step of a cycle to one observer: the cycle started, rank 0
negotiated, a response is about to run, it ran. Rank 0's timeline writer
(`unison.engine.timeline.Timeline`) implements it; `observe_all` combines those present into the one
object the loop calls, `SILENT` when there is none, so the loop never asks which are present, and a
steady call on a rank nothing watches makes no call to say so. An observer records and reports; it
never changes what the cycle does. (Rank 0's stall feed is no observer: the cycles hand it their
votes, `unison.engine.stall_feed.StallFeed.voted`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..protocol.messages import Request, Response

__all__ = ["SILENT", "CycleObserver", "Observers", "Silent", "observe_all"]


class CycleObserver(Protocol):
    """The steps of a cycle, as the engine thread reports them (only the engine thread calls these)."""

    def cycle_started(self, now: float) -> None:
        """A cycle starts at `now` (`time.monotonic`), before the queue is drained."""

    def negotiated(self, lists: Sequence[Sequence[Request]], responses: Sequence[Response]) -> None:
        """Rank 0's coordinator answered every rank's request list (index = rank) with `responses`."""

    def executing(self, response: Response) -> None:
        """`response` is about to run on the data plane (this rank is a member of its set)."""

    def executed(self, response: Response) -> None:
        """`response` ran, or failed (called after every `executing`)."""

    def close(self) -> None:
        """The engine stopped: release what the observer holds (files, threads)."""


class Silent:
    """An observer that ignores every step: the base of observers that watch only some."""

    def cycle_started(self, now: float) -> None:
        """Ignore it."""

    def negotiated(self, lists: Sequence[Sequence[Request]], responses: Sequence[Response]) -> None:
        """Ignore it."""

    def executing(self, response: Response) -> None:
        """Ignore it."""

    def executed(self, response: Response) -> None:
        """Ignore it."""

    def close(self) -> None:
        """Nothing to release."""


SILENT = Silent()
"""The observer of an engine that nothing watches (every rank but 0, and rank 0 without a timeline)."""


class Observers:
    """Several observers, told of every step in the order given."""

    def __init__(self, observers: Sequence[CycleObserver]) -> None:
        self.observers = tuple(observers)

    def __repr__(self) -> str:
        return f"<Observers {list(self.observers)}>"

    def cycle_started(self, now: float) -> None:
        """Tell each observer."""
        for observer in self.observers:
            observer.cycle_started(now)

    def negotiated(self, lists: Sequence[Sequence[Request]], responses: Sequence[Response]) -> None:
        """Tell each observer."""
        for observer in self.observers:
            observer.negotiated(lists, responses)

    def executing(self, response: Response) -> None:
        """Tell each observer."""
        for observer in self.observers:
            observer.executing(response)

    def executed(self, response: Response) -> None:
        """Tell each observer."""
        for observer in self.observers:
            observer.executed(response)

    def close(self) -> None:
        """Close each observer; the first error is raised once all were closed."""
        error: BaseException | None = None
        for observer in self.observers:
            try:
                observer.close()
            except BaseException as exc:  # noqa: BLE001 - raised below, once the others are closed
                error = error or exc
        if error is not None:
            raise error


def observe_all(*observers: CycleObserver | None) -> CycleObserver:
    """Combine the observers that are present (None is absent) into the one the loop calls.

    Example:
        >>> observe_all(None, None) is SILENT
        True
    """
    present = [observer for observer in observers if observer is not None]
    if not present:
        return SILENT
    if len(present) == 1:
        return present[0]
    return Observers(present)
