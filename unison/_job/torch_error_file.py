"""The error file torchrun reads to name a job's root cause: written by the rank that failed first.

torchrun (torch's elastic agent) gives each worker a path in ``TORCHELASTIC_ERROR_FILE``; torch's
``@record`` writes the worker's uncaught error there as JSON, and when workers fail the agent names
as "Root Cause (first observed failure)" the one with the smallest timestamp, in whole seconds,
taking the lowest rank on a tie; a worker without a file counts as failed when the agent noticed it.
When one rank fails, unison stops every rank within the same second, so without files the agent named
rank 0 whichever rank failed. So every rank whose uncaught error ends it writes its file: the rank
whose own error it is with the time of its failure, a rank stopped because of another's failure with
that time plus one second (it stopped after the cause, and the agent must not take it for one).
Among the ranks that raised one error together (a mismatch), the odd one out is the cause (the rank
that made the extra call, as unisonrun names it first); for a stall or a deadlock, rank 0, which
found it and whose file carries the report.
"""

from __future__ import annotations

import json
from typing import Any

from .._contract import write_atomically
from ..protocol.negotiation import sites_of
from .stop_report import Role, odd_order

__all__ = ["after_the_cause", "error_file_data", "write_error_file"]


def after_the_cause(role: Role, rank: int, message: str, stalled: bool) -> bool:
    """Whether `rank`'s uncaught error came after the failure's cause (its file one second later).

    Args:
        role: what the error is to this rank (`stop_report.role_of`).
        rank: this rank.
        message: the error's message (a shared error's names each rank's call site).
        stalled: the job stopped on a stall or a deadlock, which rank 0 found.

    Example:
        >>> message = "Mismatched x. Called at t.py:5 in main on rank [0]; t.py:4 in main on rank [1]."
        >>> after_the_cause(Role.SHARED, 0, message, False), after_the_cause(Role.SHARED, 1, message, False)
        (True, False)
    """
    if role is Role.SHARED:
        order = odd_order(sites_of(message))
        return bool(order) and order[0] != rank
    if role is Role.CONSEQUENCE:
        return not (stalled and rank == 0)
    return False


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
