"""Send dictionaries from a worker to the callbacks of the driver's ``run``/``execute`` (Horovod's ``ray_logger``).

The executor hands each worker a Ray queue (`configure`) when callbacks are given; `log` puts a
dictionary on it, by default on rank 0 only, and the driver calls every callback with each one.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import process_environment

__all__ = ["configure", "log"]

_log = logging.getLogger("unison.ray")


class _Sink:
    queue: Any = None
    warned = False


_sink = _Sink()


def configure(queue: Any) -> None:
    """Send what `log` is given to `queue` (a ``ray.util.queue.Queue``; None: nowhere)."""
    _sink.queue = queue


def log(info_dict: dict[str, Any], chief_only: bool = True) -> None:
    """Send `info_dict` to the driver's callbacks.

    Args:
        info_dict: any picklable dictionary.
        chief_only: send it from rank 0 only (the rank is the worker's ``RANK``); False: from every rank.

    Example:
        >>> from unison.ray import ray_logger                             # doctest: +SKIP
        >>> ray_logger.log({"epoch": 3, "loss": 0.25})                      # doctest: +SKIP
    """
    if chief_only and process_environment().get("RANK", "0") != "0":
        return
    if _sink.queue is None:
        if not _sink.warned:
            _sink.warned = True
            _log.warning("ray_logger.log was called, but the executor was given no callbacks: nothing receives it. "
                         "Pass callbacks=[...] to run() or execute().")
        return
    _sink.queue.put(info_dict)
