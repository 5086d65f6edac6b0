"""What a rank opens at `init()` for its output: rank 0's timeline and autotune log (opened then, so
that a path it cannot write fails init() on every rank), and the rank-prefixed log handler."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TextIO

from ..config import Settings
from ..errors import ConfigError
from .launch.hosts import host_name

if TYPE_CHECKING:
    from ..engine.timeline import Timeline

__all__ = ["configure_logging", "open_timeline", "open_tune_log"]


def open_timeline(settings: Settings, rank: int) -> Timeline | None:
    """Rank 0's timeline, opened now so that a path it cannot write fails init() on every rank."""
    if rank != 0 or not settings.timeline or settings.timeline.upper() == "DYNAMIC":
        return None
    from ..engine.timeline import Timeline

    try:
        return Timeline(settings.timeline, mark_cycles=settings.timeline_mark_cycles)
    except ConfigError as exc:  # the others only learn that rank 0 could not start: say it is rank 0
        raise ConfigError(f"{exc} Rank 0 (on host {host_name(settings, 0)}) writes the timeline.") from None


def open_tune_log(settings: Settings, rank: int) -> TextIO | None:
    """Rank 0's autotune log, opened now for the same reason as the timeline."""
    if rank != 0 or not settings.autotune or not settings.autotune_log:
        return None
    from ..engine.loop import open_tune_log

    return open_tune_log(settings.autotune_log)


class _RankHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """unison's own log output, used only when the application configured no logging."""


def configure_logging(settings: Settings, rank: int, size: int) -> None:
    """Prefix unison's log lines with the rank, so the output of many ranks stays readable.

    Applications that configure logging themselves (a handler on the root logger or on "unison")
    keep full control; otherwise unison's records go to stderr as
    ``2026-01-01 12:00:00,000 [unison rank 1/4 host] WARNING message`` (no time with
    ``UNISON_LOG_HIDE_TIME=1``).
    """
    logger = logging.getLogger("unison")
    ours = [h for h in logger.handlers if isinstance(h, _RankHandler)]
    if not ours and (logger.handlers or logging.getLogger().handlers):
        return
    handler = ours[0] if ours else _RankHandler()
    when = "" if settings.log_hide_time else "%(asctime)s "
    prefix = f"[unison rank {rank}/{size} {host_name(settings, rank)}]"
    handler.setFormatter(logging.Formatter(f"{when}{prefix} %(levelname)s %(message)s"))
    if not ours:
        logger.addHandler(handler)
        logger.propagate = False
