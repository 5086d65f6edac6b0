"""The autotuner at run time: the parameters in effect, rank 0's measuring, and the changes every rank applies.

The search itself is pure (`unison.protocol.autotune`). This module holds what the engine needs
around it: on every rank, the parameters in effect and the `AutotuneState`; on rank 0, the `Meter`
that turns cycles into samples, the `Tuner` fed with them, the proposal waiting to be sent (with the
next cycle's responses, as a TUNE response) and the CSV log. The engine applies each change at the
end of the cycle whose responses carry it, on every rank, and acts on what changed (`apply` returns
the parameters it replaced).
"""

from __future__ import annotations

import logging
import time
from typing import TextIO

from ..config import Settings
from ..errors import ConfigError
from ..protocol.autotune import (
    DEFAULT_GRID,
    LOG_COLUMNS,
    AutotuneState,
    AutotuneStatistics,
    Meter,
    Parameters,
    Proposal,
    Tuner,
    csv_line,
    tune_response,
)
from ..protocol.messages import Response

__all__ = ["Autotuning", "open_tune_log"]

log = logging.getLogger(__name__)


def open_tune_log(path: str) -> TextIO:
    """Open the autotune log (rank 0) and write its header; the error names the setting."""
    try:
        log_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed when the engine stops
    except OSError as exc:
        raise ConfigError(
            f"UNISON_AUTOTUNE_LOG must name a file rank 0 can write. Got UNISON_AUTOTUNE_LOG={path!r} "
            f"({exc.strerror})."
        ) from exc
    log_file.write(",".join(LOG_COLUMNS) + "\n")
    return log_file


class Autotuning:
    """The knobs the autotuner may change while the job runs, and (rank 0) the search that changes them.

    Only the engine thread calls the methods; `statistics` and `repr` may be called from any thread.

    Args:
        settings: the job's settings (the starting parameters, whether to tune, the search's budget).
        rank: this rank; rank 0 measures and searches.
        tune_log: rank 0's open log (`open_tune_log`), or None. init() opens it before the start-up
            check, so a path rank 0 cannot write fails init() on every rank, as the timeline's does.
    """

    def __init__(self, settings: Settings, rank: int, tune_log: TextIO | None = None) -> None:
        self.parameters = Parameters(settings.fusion_threshold_bytes, settings.cycle_time_seconds,
                                     settings.chunk_bytes, settings.cache_capacity > 0)
        self.state = AutotuneState.TUNING if settings.autotune else AutotuneState.OFF
        self.changes = 0
        self._tuner: Tuner | None = None  # rank 0 only: the search, its meter and its log
        self._meter: Meter | None = None
        self._due: Proposal | None = None  # decided, to be sent with the next cycle's responses
        self._log: TextIO | None = None
        self._rows_written = 0
        if settings.autotune and rank == 0:
            grid = dict(DEFAULT_GRID)
            if settings.cache_capacity <= 0:
                grid["cache_enabled"] = ()
            self._tuner = Tuner(self.parameters, warmup_samples=settings.autotune_warmup_samples,
                                max_samples=settings.autotune_max_samples, grid=grid)
            self._meter = Meter(settings.autotune_steps_per_sample)
            self._log = tune_log
        self._rank = rank

    def __repr__(self) -> str:
        return f"<Autotuning {self.state} changes={self.changes} parameters={self.parameters}>"

    @property
    def measuring(self) -> bool:
        """Whether this rank measures the cycles (rank 0, while tuning)."""
        return self._meter is not None and self.state is AutotuneState.TUNING

    @property
    def due(self) -> bool:
        """Whether rank 0 has decided a change that the next cycle's responses must carry."""
        return self._due is not None

    def quiet(self) -> bool:
        """Whether the tuner neither measures nor has a change due, and keeps the response cache on: a
        cycle may then be the steady state's alone (`unison.engine.cycles.Cycles.solo_ready`, one call
        for `measuring`, `due` and the cache's setting on every steady call)."""
        return (self._due is None and (self._meter is None or self.state is not AutotuneState.TUNING)
                and self.parameters.cache_enabled)

    def take_due(self) -> Response | None:
        """Rank 0: the TUNE response to append to this cycle's responses, once; None when none is due."""
        if self._due is None:
            return None
        response, self._due = tune_response(self._due), None
        return response

    def apply(self, proposal: Proposal) -> Parameters:
        """Make `proposal` the parameters in effect; return the ones it replaces.

        Every rank calls this at the end of the same cycle; the caller acts on what changed.
        """
        old = self.parameters
        self.parameters = proposal.parameters
        self.changes += 1
        if proposal.final:
            self.state = AutotuneState.SETTLED
            if self._rank == 0:
                log.info("autotune settled on %s", proposal.parameters)
        elif self.state is AutotuneState.OFF:
            self.state = AutotuneState.TUNING
        return old

    def measure(self, reduced_bytes: int, started: float, restart: bool) -> None:
        """Rank 0: add this cycle to the current sample; feed finished samples to the search.

        Args:
            reduced_bytes: bytes this rank reduced in the cycle (allreduce and reducescatter).
            started: when the cycle started (`time.monotonic`).
            restart: the parameters changed at the end of this cycle: measure them from the next.
        """
        assert self._meter is not None and self._tuner is not None
        if restart:
            self._meter.restart()
            return
        if self._due is not None or self._tuner.chosen is not None:
            return  # a change is on its way; cycles until it lands belong to no sample
        sample = self._meter.cycle(reduced_bytes, started, time.monotonic())
        if sample is None:
            return
        proposal = self._tuner.add_sample(*sample)
        if self._log is not None:
            rows = self._tuner.rows
            for row in rows[self._rows_written:]:
                self._log.write(csv_line(row) + "\n")
            self._rows_written = len(rows)
            self._log.flush()
        if proposal is not None:
            self._due = proposal

    def statistics(self) -> AutotuneStatistics | None:
        """Where the autotuner stands; None when ``UNISON_AUTOTUNE`` is off."""
        if self.state is AutotuneState.OFF:
            return None
        return AutotuneStatistics(self.state, self.parameters, self.changes)

    def close(self) -> None:
        """Close rank 0's log (the engine stops)."""
        if self._log is not None:
            self._log.close()
