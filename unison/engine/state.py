"""An engine's lifecycle states and the snapshot of its counters (`Engine.statistics`)."""

from __future__ import annotations

import dataclasses

from ..ops import TextEnum
from ..protocol.autotune import AutotuneStatistics
from ..protocol.cache import CacheStatistics
from ..protocol.negotiation import CoordinatorStatistics
from ..protocol.stall import StallStatistics
from .executor import ExecutorStatistics

__all__ = ["EngineState", "EngineStatistics"]


@dataclasses.dataclass(frozen=True)
class EngineStatistics:
    """A snapshot of an `Engine`'s counters and those of the parts it drives.

    `dataclasses.asdict` turns it into plain, JSON-ready data. `queued` counts submissions waiting
    for the engine thread, `held` those inside `batch()` blocks still open. `backend` holds the
    selected backend's own counters (they differ by backend: bytes moved, liveness probes, service
    calls); `coordinator` and `stall` are present on rank 0 only; `autotune` on every rank when
    ``UNISON_AUTOTUNE`` is on (the same on every rank: changes are applied at the same cycle).
    """

    cycles: int
    fast_cycles: int
    slow_cycles: int
    driven_cycles: int
    rows_gathered: int
    cache_hits_executed: int
    responses: int
    errors: int
    queued: int
    held: int
    cache: CacheStatistics
    executor: ExecutorStatistics
    backend: dict[str, float]
    coordinator: CoordinatorStatistics | None = None
    stall: StallStatistics | None = None
    autotune: AutotuneStatistics | None = None


class EngineState(TextEnum):
    """An engine's lifecycle: created, then running once started, then stopped for good.

    A `str` mixin, so a state compares equal to its value (``EngineState.RUNNING == "running"``).
    """

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
