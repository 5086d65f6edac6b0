"""Remove the MPICH shared-memory segments that a launch's ranks on this host left behind when they were stopped.

MPICH's ranks on one host talk through segments in ``/dev/shm`` (``mpich_shm_*``, about 1-3 MB each
here), unlinked by ``MPI_Finalize``. A rank killed by a signal, or ended by ``MPI_Abort`` or
``os._exit``, never gets there, so every abruptly stopped launch left its segments, and an elastic job
left one set per relaunch. The supervisor records which segments its local ranks map (their
``/proc/PID/maps``: at their start, about once a second while they run, and right before it kills
them) and removes those that still exist once every rank of the launch has ended: only the launch's
own, never another job's. Segments of ranks on other hosts stay there.
"""

from __future__ import annotations

from collections.abc import Iterable

from .reaper import mapped_segments, remove_segments

__all__ = ["Segments"]

SAMPLE_EVERY_SECONDS = 1.0


class Segments:
    """The segments a launch's local ranks mapped: `sample` while they run, `remove` once they ended.

    Example:
        >>> segments = Segments()
        >>> segments.sample([], now=0.0)
        >>> segments.remove()
        []
    """

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.samples = 0
        self.removed: list[str] = []
        self._sampled_at = float("-inf")
        self._seen: set[int] = set()

    def __repr__(self) -> str:
        return f"<Segments mapped={len(self.paths)} removed={len(self.removed)}>"

    def statistics(self) -> dict[str, int]:
        return {"mapped": len(self.paths), "samples": self.samples, "removed": len(self.removed)}

    def sample(self, pids: Iterable[int], now: float, force: bool = False) -> None:
        """Read what `pids` map: each new pid at once, all of them once `SAMPLE_EVERY_SECONDS` passed
        (or with `force`, before the launcher kills them)."""
        pids = list(pids)
        due = force or now - self._sampled_at >= SAMPLE_EVERY_SECONDS
        for pid in pids:
            if due or pid not in self._seen:
                self.paths |= mapped_segments(pid)
                self._seen.add(pid)
        if due:
            self._sampled_at = now
            self.samples += 1

    def remove(self) -> list[str]:
        """Unlink the recorded segments that still exist (call once every rank of the launch ended)."""
        removed = remove_segments(self.paths)
        self.removed += removed
        self.paths -= set(removed)
        return removed
