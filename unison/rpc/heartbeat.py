"""The loop of every heartbeat and watch thread: act every few seconds until told to stop.

Four threads run it: a rank's heartbeats to the coordinator service (every second) and the service's
watch over the ranks (every quarter second); a trainer's heartbeats to its parameter servers (every
second) and each server's watch over its trainers (every quarter second). What a beat carries and
what silence means differ between the two services, on purpose (docs/architecture.md, "Heartbeats"):

- A rank sends its beats as messages on one stream that stays open for the job, carrying its cycle
  count and the tensors it waits on (rank 0 serves them as the live status table), and the replies
  carry the job's abort reason back. Rank 0 never comes back, so silence is the end: a rank silent
  for ``UNISON_HEARTBEAT_TIMEOUT_SECONDS`` aborts the job, and a rank whose beats go unanswered that
  long aborts itself (a watchdog, since a stream has no per-beat deadline). One stream per rank
  costs rank 0 about 0.7x the CPU of one call per beat, measured at 256 ranks.
- A trainer calls each server once per beat, with a deadline of a second: a call that fails or
  times out is how a stopped server is noticed while another call waits on it. A server comes back
  on its address after a restart, so silence opens a reconnect window (``UNISON_PS_RECONNECT_SECONDS``)
  instead of ending the job, and a call per beat reaches the new process without reopening anything.
  A trainer has no progress to report and a server no abort to send back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["every"]


def every(seconds: float, stop: threading.Event, beat: Callable[[], bool]) -> None:
    """Call `beat` every `seconds`, the first time after `seconds`, until `stop` is set or `beat` returns False.

    Example:
        >>> stop, beats = threading.Event(), []
        >>> every(0.001, stop, lambda: beats.append(1) or len(beats) < 3)
        >>> len(beats)
        3
    """
    while not stop.wait(seconds):
        if not beat():
            return
