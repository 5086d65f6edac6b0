"""The autotuner's search: which fusion threshold, cycle time, chunk size and cache use to measure next.

With ``UNISON_AUTOTUNE=1`` rank 0 measures the job's throughput (bytes reduced per second of wall
time) over samples of ``steps_per_sample`` cycles that reduced something, and this module decides,
from those numbers alone, which parameter set the next sample runs with. The engine turns each
decision into a ``TUNE`` response that travels with the cycle's other responses, so every rank
applies the same parameters at the end of the same cycle (`tune_response`, `split_tuning`).

The search is a **coordinate sweep with re-measurement**, chosen over a Gaussian-process optimiser
because it is small enough to explain in three lines and to test with hand-written scores:

1. The first ``warmup_samples`` samples run with the starting parameters and are discarded (caches,
   buffers and the framework are still warming up).
2. *Sweep.* The starting parameters are measured; then each parameter in turn (fusion threshold,
   cycle time, chunk size, cache use) takes every value of its small grid while the others stay at
   the best found so far, and keeps the value whose configuration scored best.
3. *Confirm.* Scores are noisy (other processes, the framework's own variation), so the samples left
   of ``max_samples`` re-measure the three best configurations, always the one with fewest samples
   first. Configurations are compared by the median of their samples.
4. *Settle* on the best median among configurations measured at least twice (the best single score
   when the budget allowed no repeat).

A parameter space of four grids of at most four values needs 11 samples to sweep; the default
budget of 20 leaves 9 to confirm. A Gaussian process would need its kernel, its noise level and an
acquisition function tuned to a space this small and discrete, for no gain we could measure.

Everything here is plain data in, plain data out: unit-tested without threads or MPI.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .messages import Response, ResponseKind, TextEnum

__all__ = [
    "AutotuneState",
    "AutotuneStatistics",
    "DEFAULT_GRID",
    "LOG_COLUMNS",
    "LogRow",
    "Meter",
    "PARAMETER_NAMES",
    "Parameters",
    "Proposal",
    "Tuner",
    "TunerPhase",
    "csv_line",
    "read_tune_response",
    "split_tuning",
    "tune_response",
]

KiB, MiB = 1024, 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Parameters:
    """One point of the search: the knobs the autotuner changes while the job runs.

    Attributes:
        fusion_threshold_bytes: most bytes in one fused reduction (0: no fusion).
        cycle_time_seconds: minimum time between the starts of two cycles.
        chunk_bytes: the data plane reduces large buffers in chunks of this many bytes.
        cache_enabled: whether the response cache answers repeated requests.
    """

    fusion_threshold_bytes: int
    cycle_time_seconds: float
    chunk_bytes: int
    cache_enabled: bool


PARAMETER_NAMES = ("fusion_threshold_bytes", "cycle_time_seconds", "chunk_bytes", "cache_enabled")

# Small grids around the values that measured well here (docs/architecture.md): fusion beyond a few
# MiB rarely changes a plan because only tensors up to 64 KiB are fused; 2-4 MiB chunks were fastest
# on shared memory; pacing trades latency for fuller cycles.
DEFAULT_GRID: Mapping[str, tuple[object, ...]] = {
    "fusion_threshold_bytes": (512 * KiB, 2 * MiB, 8 * MiB, 128 * MiB),
    "cycle_time_seconds": (0.0, 0.0005, 0.002, 0.005),
    "chunk_bytes": (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB),
    "cache_enabled": (True, False),
}

_CONFIRM_CANDIDATES = 3


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A parameter set for every rank to apply; `final` once the search has settled on it."""

    parameters: Parameters
    final: bool


class TunerPhase(TextEnum):
    """Where the search is: discarding warm-up samples, sweeping one parameter at a time, confirming
    the best point, settled; ``chosen`` marks the log's last row, the setting kept."""

    WARMUP = "warmup"
    SWEEP = "sweep"
    CONFIRM = "confirm"
    SETTLED = "settled"
    CHOSEN = "chosen"


@dataclasses.dataclass(frozen=True)
class LogRow:
    """One row of the autotune log: a measured sample, or (``phase="chosen"``) the setting kept.

    Attributes:
        sample: 1-based sample number (warm-up included); 0 on the chosen row.
        phase: ``warmup``, ``sweep``, ``confirm`` or ``chosen``.
        parameters: the parameters the sample ran with (the chosen ones on the last row).
        bytes_reduced: bytes reduced during the sample (the chosen row: 0).
        seconds: its wall time (the chosen row: 0).
        score: bytes per second (the chosen row: the median score of the chosen parameters).
    """

    sample: int
    phase: str  # a TunerPhase
    parameters: Parameters
    bytes_reduced: int
    seconds: float
    score: float

    @property
    def warmup(self) -> bool:
        """Whether the sample was discarded as warm-up."""
        return self.phase == TunerPhase.WARMUP


LOG_COLUMNS = ("sample", "phase", "warmup", "fusion_threshold_bytes", "cycle_time_ms", "chunk_bytes",
               "cache_enabled", "bytes_reduced", "seconds", "score_bytes_per_second")


def csv_line(row: LogRow) -> str:
    """Render one log row as a CSV line (columns `LOG_COLUMNS`, no newline).

    Example:
        >>> csv_line(LogRow(4, "sweep", Parameters(2097152, 0.0005, 4194304, True), 1000, 0.5, 2000.0))
        '4,sweep,0,2097152,0.5,4194304,1,1000,0.500000,2000.0'
    """
    p = row.parameters
    return ",".join((
        str(row.sample), row.phase, str(int(row.warmup)), str(p.fusion_threshold_bytes),
        f"{p.cycle_time_seconds * 1000:g}", str(p.chunk_bytes), str(int(p.cache_enabled)),
        str(row.bytes_reduced), f"{row.seconds:.6f}", f"{row.score:.1f}",
    ))


class AutotuneState(TextEnum):
    """Where the autotuner stands on a rank: off (``UNISON_AUTOTUNE`` unset), tuning, then settled.

    A `str` mixin, so a state compares equal to its value (``AutotuneState.SETTLED == "settled"``).
    Every rank moves from tuning to settled at the end of the same cycle (the one whose responses
    carry the final TUNE response).
    """

    OFF = "off"
    TUNING = "tuning"
    SETTLED = "settled"


@dataclasses.dataclass(frozen=True)
class AutotuneStatistics:
    """Where the autotuner stands on this rank (the same on every rank once a cycle is applied).

    Attributes:
        state: ``tuning`` while samples are taken, ``settled`` once the chosen setting is applied.
        parameters: the parameters in effect (the chosen ones once settled).
        changes: parameter sets applied so far (the chosen one included).
    """

    state: AutotuneState
    parameters: Parameters
    changes: int


class Meter:
    """Adds up the cycles that reduced something into samples of `steps` cycles.

    A sample runs from the start of its first such cycle to the end of its last, so each covers the
    same kind of interval; cycles that reduced nothing add wall time but do not count as steps.

    Example:
        >>> m = Meter(2)
        >>> m.cycle(100, 0.0, 0.1), m.cycle(0, 0.2, 0.3), m.cycle(300, 0.4, 0.5)
        (None, None, (400, 0.5))
    """

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a sample must span at least 1 cycle. Got steps={steps}.")
        self.steps = steps
        self._start: float | None = None
        self._count = 0
        self._bytes = 0

    def restart(self) -> None:
        """Drop what was measured so far (the parameters changed); the next sample starts afresh."""
        self._start = None
        self._count = 0
        self._bytes = 0

    def cycle(self, bytes_reduced: int, started: float, ended: float) -> tuple[int, float] | None:
        """Count one cycle; return (bytes, seconds) when it completes a sample, else None."""
        if self._start is None:
            if bytes_reduced <= 0:
                return None
            self._start = started
        if bytes_reduced > 0:
            self._count += 1
            self._bytes += bytes_reduced
        if self._count < self.steps:
            return None
        sample = (self._bytes, max(ended - self._start, 1e-9))
        self.restart()
        return sample


class Tuner:
    """The search (see the module docstring): fed one sample at a time, answers what to run next.

    Args:
        start: the configured parameters (the first point measured, and the warm-up's).
        warmup_samples: samples discarded at the start.
        max_samples: samples measured after the warm-up before settling.
        grid: parameter name -> values to try; the starting value is always added. A parameter
            with a single value is not swept.

    Example:
        >>> t = Tuner(Parameters(1024, 0.0, 4096, True), warmup_samples=0, max_samples=2,
        ...           grid={"chunk_bytes": (4096, 8192)})
        >>> t.add_sample(100, 1.0).parameters.chunk_bytes     # 4096 scored 100 B/s: try 8192
        8192
        >>> p = t.add_sample(300, 1.0); p.final, p.parameters.chunk_bytes
        (True, 8192)
    """

    def __init__(self, start: Parameters, *, warmup_samples: int, max_samples: int,
                 grid: Mapping[str, Sequence[object]] | None = None) -> None:
        if warmup_samples < 0 or max_samples < 1:
            raise ValueError("the autotuner needs warmup_samples >= 0 and max_samples >= 1. "
                             f"Got warmup_samples={warmup_samples}, max_samples={max_samples}.")
        grid = DEFAULT_GRID if grid is None else grid
        unknown = sorted(set(grid) - set(PARAMETER_NAMES))
        if unknown:
            raise ValueError(f"grid names must be among {list(PARAMETER_NAMES)}. Got {unknown}.")
        self.start = start
        self.warmup_samples = warmup_samples
        self.max_samples = max_samples
        # Any: each name's values have that field's type (int, float or bool), which
        # dataclasses.replace(**{name: value}) checks field by field.
        self._grid: dict[str, tuple[Any, ...]] = {}
        for name in PARAMETER_NAMES:
            current = getattr(start, name)
            values = [current] + [v for v in grid.get(name, ()) if v != current]
            self._grid[name] = tuple(values)
        self._scores: dict[Parameters, list[float]] = {}
        self._rows: list[LogRow] = []
        self._samples = 0  # every sample fed, warm-up included
        self._measured = 0  # samples after the warm-up
        self._best = start
        self._sweep = [name for name in PARAMETER_NAMES if len(self._grid[name]) > 1]
        self._open: str | None = None  # the parameter whose values are being swept
        self._queue: list[Parameters] = [start]  # the sweep's points still to measure
        self._phase = TunerPhase.SWEEP
        self.current = start  # the parameters the next sample runs with
        self.chosen: Parameters | None = None

    def __repr__(self) -> str:
        return (f"<Tuner phase={self.phase} samples={self._samples} measured={self._measured}/"
                f"{self.max_samples} best={self._best}>")

    @property
    def phase(self) -> TunerPhase:
        """``warmup``, ``sweep``, ``confirm`` or ``settled``."""
        if self.chosen is not None:
            return TunerPhase.SETTLED
        if self._samples < self.warmup_samples:
            return TunerPhase.WARMUP
        return self._phase

    @property
    def rows(self) -> list[LogRow]:
        """Every log row so far (a copy), in order."""
        return list(self._rows)

    def median(self, parameters: Parameters) -> float | None:
        """The median score of a configuration, or None when it was never measured."""
        scores = self._scores.get(parameters)
        return statistics.median(scores) if scores else None

    def add_sample(self, bytes_reduced: int, seconds: float) -> Proposal | None:
        """Record one sample of `current`; return what every rank must apply next, or None to keep
        `current` (the next sample measures it again).

        Raises:
            RuntimeError: the search has already settled.
        """
        if self.chosen is not None:
            raise RuntimeError(f"the autotuner settled on {self.chosen}; it takes no more samples.")
        if seconds <= 0:
            raise ValueError(f"a sample must take a positive time. Got seconds={seconds}.")
        score = bytes_reduced / seconds
        self._samples += 1
        phase = self.phase if self._samples > self.warmup_samples else TunerPhase.WARMUP
        self._rows.append(LogRow(self._samples, phase, self.current, bytes_reduced, seconds, score))
        if phase is TunerPhase.WARMUP:
            return None
        self._measured += 1
        self._scores.setdefault(self.current, []).append(score)
        if self._measured >= self.max_samples:
            return self._settle()
        return self._advance(self._next())

    def _advance(self, nxt: Parameters) -> Proposal | None:
        if nxt == self.current:
            return None
        self.current = nxt
        return Proposal(nxt, final=False)

    def _next(self) -> Parameters:
        if self._phase is TunerPhase.SWEEP:
            if self._queue and self._queue[0] == self.current:
                self._queue.pop(0)
            while not self._queue:
                if self._open is not None:
                    self._close_parameter(self._open)
                if not self._sweep:
                    break
                self._open = self._sweep.pop(0)
                self._queue = [point for point in self._values_of(self._open) if point not in self._scores]
            if self._queue:
                return self._queue[0]
            self._phase = TunerPhase.CONFIRM
        return self._confirm_next()

    def _values_of(self, name: str) -> list[Parameters]:
        """The best point so far with `name` set to each value of its grid."""
        return [dataclasses.replace(self._best, **{name: value}) for value in self._grid[name]]

    def _close_parameter(self, name: str) -> None:
        """Keep the value of `name` whose configuration scored best."""
        self._best = self._argmax(point for point in self._values_of(name) if point in self._scores)
        self._open = None

    def _ranked(self) -> list[Parameters]:
        """Measured configurations, best median first (ties: the one measured first)."""
        order = list(self._scores)
        return sorted(order, key=lambda p: (-statistics.median(self._scores[p]), order.index(p)))

    def _argmax(self, candidates: Iterable[Parameters]) -> Parameters:
        pool = set(candidates)
        return next(p for p in self._ranked() if p in pool)

    def _confirm_next(self) -> Parameters:
        top = self._ranked()[:_CONFIRM_CANDIDATES]
        fewest = min(len(self._scores[p]) for p in top)
        return next(p for p in top if len(self._scores[p]) == fewest)

    def _settle(self) -> Proposal:
        repeated = [p for p in self._scores if len(self._scores[p]) >= 2]
        chosen = self._argmax(repeated) if repeated else self._argmax(self._scores)
        self.chosen = self.current = chosen
        score = statistics.median(self._scores[chosen])
        self._rows.append(LogRow(0, TunerPhase.CHOSEN, chosen, 0, 0.0, score))
        return Proposal(chosen, final=True)

    def statistics(self) -> dict[str, float]:
        """Counters: samples fed (warm-up included), samples measured, configurations measured."""
        return {"samples": self._samples, "measured": self._measured, "configurations": len(self._scores)}


def tune_response(proposal: Proposal) -> Response:
    """The response that carries a parameter set to every rank (rank 0 appends it to a cycle's list).

    Example:
        >>> r = tune_response(Proposal(Parameters(1024, 0.002, 4096, False), final=True))
        >>> r.kind, r.sizes, r.message
        (<Kind.TUNE: 'tune'>, (1024, 0.002, 4096, 0), 'settled')
    """
    p = proposal.parameters
    return Response(ResponseKind.TUNE, (), sizes=(p.fusion_threshold_bytes, p.cycle_time_seconds,
                                                  p.chunk_bytes, int(p.cache_enabled)),
                    message="settled" if proposal.final else "trial")


def read_tune_response(response: Response) -> Proposal:
    """The inverse of `tune_response`.

    Raises:
        ValueError: the response is not a well-formed TUNE response.
    """
    if response.kind != ResponseKind.TUNE or len(response.sizes) != 4:
        raise ValueError(f"expected a tune response with 4 parameters. Got {response!r}.")
    fusion, cycle, chunk, cache = response.sizes
    parameters = Parameters(int(fusion), float(cycle), int(chunk), bool(cache))
    return Proposal(parameters, final=response.message == "settled")


def split_tuning(responses: Sequence[Response]) -> tuple[list[Response], Proposal | None]:
    """Separate a cycle's TUNE response (at most one is sent) from the responses that run.

    Example:
        >>> rest, p = split_tuning([Response("barrier", ("b",)),
        ...                         tune_response(Proposal(Parameters(0, 0.0, 1, True), final=False))])
        >>> [r.kind.value for r in rest], p.parameters.chunk_bytes, p.final
        (['barrier'], 1, False)
    """
    rest: list[Response] = []
    proposal: Proposal | None = None
    for response in responses:
        if response.kind == ResponseKind.TUNE:
            proposal = read_tune_response(response)
        else:
            rest.append(response)
    return rest, proposal
