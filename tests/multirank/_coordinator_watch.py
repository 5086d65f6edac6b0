"""Order one rank's calls after a state of the coordinator (rank 0's negotiation) without a sleep.

Rank 0 watches its coordinator's counters (``hvd.statistics().coordinator``) in a thread and leaves a
marker file once they reach the state; any rank waits for the marker, with a deadline.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import unison as hvd

if TYPE_CHECKING:
    from unison.protocol.negotiation import CoordinatorStatistics

POLL_SECONDS = 0.002


class CoordinatorWatch:
    """Every rank creates it (a collective: rank 0 shares the marker's directory); ``wait()`` returns
    once rank 0's coordinator has reached the state; ``close()`` ends the watch."""

    def __init__(self, reached: Callable[[CoordinatorStatistics], bool], deadline_seconds: float) -> None:
        self._deadline_seconds = deadline_seconds
        self._stop = threading.Event()
        own = tempfile.mkdtemp(prefix="unison-watch-") if hvd.rank() == 0 else None
        self._directory = Path(hvd.broadcast_object(own, root_rank=0, name="coordinator_watch.directory"))
        self._marker = self._directory / "reached"
        self._thread: threading.Thread | None = None
        if hvd.rank() == 0:
            self._thread = threading.Thread(target=self._watch, args=(reached,), daemon=True)
            self._thread.start()

    def _watch(self, reached: Callable[[CoordinatorStatistics], bool]) -> None:
        deadline = time.monotonic() + self._deadline_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            coordinator = hvd.statistics().coordinator
            if coordinator is not None and reached(coordinator):
                self._marker.touch()
                return
            self._stop.wait(POLL_SECONDS)

    def wait(self) -> None:
        """Return once the coordinator has reached the state; fail after the deadline."""
        deadline = time.monotonic() + self._deadline_seconds
        while not self._marker.exists():
            assert time.monotonic() < deadline, f"the coordinator did not reach the state in {self._deadline_seconds} s"
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        """Stop watching; rank 0 removes the marker's directory."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            shutil.rmtree(self._directory, ignore_errors=True)
