"""The error file torchrun reads to name a job's root cause: written by the rank that failed first.

torchrun (torch's elastic agent) gives each worker a path in ``TORCHELASTIC_ERROR_FILE``; torch's
``@record`` writes the worker's uncaught error there as JSON, and when workers fail the agent names
as "Root Cause (first observed failure)" the one with the smallest timestamp, in whole seconds,
taking the lowest rank on a tie; a worker without a file counts as failed when the agent noticed it.
When one rank fails, unison stops every rank within the same second, so without files the agent named
rank 0 whichever rank failed. So every rank whose uncaught error ends it writes its file: the rank
whose own error it is with the time of its failure, a rank stopped because of another's failure with
that time plus one second (it stopped after the cause, and the agent must not take it for one).
"""

from __future__ import annotations

import json
from typing import Any

from .._contract import write_atomically

__all__ = ["error_file_data", "write_error_file"]


def error_file_data(message: str, callstack: str, now_seconds: float, consequence: bool) -> dict[str, Any]:
    """The JSON torch's ``ErrorHandler.record_exception`` writes, for an error that ended this worker.

    Args:
        message: ``Type: message`` of the error.
        callstack: what the agent prints as the failure's traceback.
        now_seconds: ``time.time()`` now.
        consequence: the worker stopped because another rank failed: its time is one second later.

    Example:
        >>> error_file_data("AbortedError: rank 1 failed", "unison: rank 0 stopped", 100.7, True)
        {'message': {'message': 'AbortedError: rank 1 failed', 'extraInfo': {'py_callstack': 'unison: rank 0 stopped', 'timestamp': '101'}}}
    """
    timestamp = int(now_seconds) + (1 if consequence else 0)
    return {"message": {"message": message, "extraInfo": {"py_callstack": callstack, "timestamp": str(timestamp)}}}


def write_error_file(path: str, data: dict[str, Any]) -> bool:
    """Write `data` to `path` (atomically, replacing a file ``@record`` may have written); False if it could not."""
    try:
        write_atomically(path, json.dumps(data))
    except (OSError, ValueError):
        return False
    return True
