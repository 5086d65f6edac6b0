"""This rank's flight record: the last collectives it submitted, kept in a fixed-size ring.

The cycles append one record per collective where it enters a cycle (`Cycles.run` takes it from the
queue, `Cycles.solo` and `Cycles.steady` run it at once) and mark it when it runs or fails: the
request (name, kind, shape, dtype, process set, site), when it was taken, when it finished, and its
state. The steady state's call appends one tuple made of values its cycle has anyway, so recording
costs one append; the ring drops the oldest record past its capacity. When the job stalls, deadlocks
or a rank fails, every rank writes its record (`snapshot`, written by `unison._job.flight_file`), and
the records of the ranks, side by side, show where they diverged (`python -m unison.launcher.flight`).

Example:
    >>> from unison.ops import CollectiveKind
    >>> from unison.protocol.messages import Request
    >>> record = FlightRecord(capacity=2)
    >>> record.submitted(Request("allreduce.a", CollectiveKind.ALLREDUCE, 0), 1.0)
    >>> record.append((Request("allreduce.b", CollectiveKind.ALLREDUCE, 0), 2.0, 2.0, DONE))
    >>> [(entry["name"], entry["state"]) for entry in record.snapshot(wall_offset=0.0)]
    [('allreduce.a', 'pending'), ('allreduce.b', 'done')]
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..protocol.messages import Request, Response

if TYPE_CHECKING:
    from .loop import Engine

__all__ = ["DEFAULT_CAPACITY", "DONE", "FAILED", "PENDING", "FlightRecord", "record_of"]

DEFAULT_CAPACITY = 1000
PENDING, DONE, FAILED = 0, 1, 2
_STATES = {PENDING: "pending", DONE: "done", FAILED: "failed"}


class FlightRecord:
    """The ring of this rank's last collectives (only the thread running a cycle appends; any reads).

    Args:
        capacity: records kept; 0 keeps none.

    Attributes:
        append: appends one finished record, ``(request, taken, finished, state)`` (the steady state's).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._ring: collections.deque[Any] = collections.deque(maxlen=max(0, capacity))
        self._open: dict[str, list[Any]] = {}  # name -> its record, while it waits to run
        self.append = self._ring.append

    def __repr__(self) -> str:
        return f"<FlightRecord {len(self._ring)}/{self.capacity} open={len(self._open)}>"

    def __len__(self) -> int:
        return len(self._ring)

    @property
    def capacity(self) -> int:
        """Records kept."""
        return self._ring.maxlen or 0

    def resize(self, capacity: int) -> None:
        """Keep `capacity` records from now on (the newest of those kept so far stay)."""
        self._ring = collections.deque(self._ring, maxlen=max(0, capacity))
        self.append = self._ring.append

    def submitted(self, request: Request, now: float) -> None:
        """`request` was taken at `now` and waits to run (`finished` marks it)."""
        if not self._ring.maxlen:
            return
        record = [request, now, 0.0, PENDING]
        self._ring.append(record)
        self._open[request.name] = record

    def finished(self, response: Response, now: float, failed: bool = False) -> None:
        """The collectives of `response` ran (or failed) at `now`."""
        if not self._open:
            return
        state = FAILED if failed else DONE
        for name in response.names:
            record = self._open.pop(name, None)
            if record is not None:
                record[2], record[3] = now, state

    def snapshot(self, wall_offset: float) -> list[dict[str, Any]]:
        """The records, oldest first, as plain data; times on the wall clock (`time.time`), which is
        `wall_offset` ahead of `time.monotonic`."""
        return [_entry(record, wall_offset) for record in list(self._ring)]


def _entry(record: Iterable[Any], wall_offset: float) -> dict[str, Any]:
    request, taken, finished, state = record
    return {"name": request.name, "kind": request.kind.value, "shape": list(request.shape),
            "dtype": request.dtype.value, "set": request.process_set_id, "state": _STATES.get(state, "?"),
            "taken": round(taken + wall_offset, 6),
            "finished": round(finished + wall_offset, 6) if state != PENDING else None, "site": request.site}


def record_of(engine: Engine) -> FlightRecord:
    """The flight record of `engine` (its cycles keep it)."""
    return engine._cycles.flight
