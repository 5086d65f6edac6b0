"""Whether a trainer still waits for a parameter server, decided from when it last reached it: plain data in, text out.

A trainer notes, per server, the first failed contact since the last one that worked (a call that
found the server down, a heartbeat that got no answer in time). It waits for the server, retrying
its calls, for `reconnect_seconds` from that moment (a server restarted on its address within the
window is picked up); after it, every call to that server, including one already waiting, ends
with `ServerUnavailableError` naming the server, its address and since when it has not answered.

Example:
    >>> down = Unreached(since=100.0, since_wall=1_700_000_000.0, error="UNAVAILABLE: connection refused")
    >>> gave_up(down, now=130.0, reconnect_seconds=60.0), gave_up(down, now=161.0, reconnect_seconds=60.0)
    (False, True)
"""

from __future__ import annotations

import dataclasses
import time

__all__ = ["Unreached", "gave_up", "unavailable_message"]


@dataclasses.dataclass(frozen=True)
class Unreached:
    """A server not reached since `since` (monotonic; `since_wall` the same moment by the clock), last `error`."""

    since: float
    since_wall: float
    error: str = ""


def gave_up(unreached: Unreached | None, now: float, reconnect_seconds: float) -> bool:
    """Whether the trainer stops waiting: the server has not answered for longer than `reconnect_seconds`."""
    return unreached is not None and now - unreached.since > reconnect_seconds


def unavailable_message(*, server: int, endpoint: str, trainer: int, method: str, unreached: Unreached, now: float,
                        reconnect_seconds: float) -> str:
    """The text of the `ServerUnavailableError` a trainer raises once it gave up on `server`.

    Example:
        >>> down = Unreached(since=100.0, since_wall=1_700_000_000.0, error="UNAVAILABLE: connection refused")
        >>> text = unavailable_message(server=1, endpoint="h:6001", trainer=0, method="Push", unreached=down,
        ...                            now=161.2, reconnect_seconds=60.0)
        >>> text[:65], text[text.index("(61.2"):][:81]
        ('parameter server 1 (h:6001) has not answered trainer 0 since 2023', '(61.2 s, over the reconnect window of 60 s; last: UNAVAILABLE: connection refused')
    """
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unreached.since_wall))
    last = f"; last: {unreached.error}" if unreached.error else ""
    return (f"parameter server {server} ({endpoint}) has not answered trainer {trainer} since {when} "
            f"({now - unreached.since:.1f} s, over the reconnect window of {reconnect_seconds:g} s{last}), so its "
            f"{method} failed: the server died, is stopped, or cannot be reached (or refuses this trainer's channel: "
            "UNISON_TLS_* must be set alike on servers and trainers). A server restarted on the same "
            "address within the window (UNISON_PS_RECONNECT_SECONDS), with its checkpoint directory, is picked up "
            "and training goes on; unisonrun --pservers restarts a lost server itself when UNISON_PS_CHECKPOINT_DIR "
            "is set (docs/ps.md).")
