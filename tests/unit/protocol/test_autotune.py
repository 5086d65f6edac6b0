"""The autotuner's search on hand-written score sequences: warm-up, sweep, confirmation, the chosen setting."""

from __future__ import annotations

import dataclasses

import pytest

from unison.protocol.autotune import (
    LOG_COLUMNS,
    LogRow,
    Meter,
    Parameters,
    Proposal,
    Tuner,
    csv_line,
    read_tune_response,
    split_tuning,
    tune_response,
)
from unison.protocol.messages import Response, ResponseKind, decode_responses, encode_responses

START = Parameters(fusion_threshold_bytes=100, cycle_time_seconds=0.0, chunk_bytes=10, cache_enabled=True)
GRID = {"fusion_threshold_bytes": (100, 200), "chunk_bytes": (10, 20, 30)}


def run(tuner: Tuner, score_of, limit: int = 100) -> list[Proposal | None]:
    """Feed the tuner one sample per step, scored by `score_of(parameters)` (1 s each), until settled."""
    out = []
    for _ in range(limit):
        if tuner.chosen is not None:
            break
        out.append(tuner.add_sample(int(score_of(tuner.current)), 1.0))
    return out


def test_warmup_samples_are_discarded_and_keep_the_start() -> None:
    tuner = Tuner(START, warmup_samples=2, max_samples=5, grid=GRID)
    assert tuner.add_sample(10**9, 1.0) is None  # an absurd warm-up score must not count
    assert tuner.add_sample(10**9, 1.0) is None
    assert tuner.phase == "sweep"
    assert tuner.median(START) is None
    proposal = tuner.add_sample(50, 1.0)  # the first real sample measures the start
    assert tuner.median(START) == 50
    assert proposal == Proposal(dataclasses.replace(START, fusion_threshold_bytes=200), final=False)
    assert [row.phase for row in tuner.rows] == ["warmup", "warmup", "sweep"]
    assert [row.warmup for row in tuner.rows] == [True, True, False]


def test_sweep_takes_each_parameter_in_turn_and_keeps_the_best_value() -> None:
    scores = {(100, 10): 10, (200, 10): 30, (200, 20): 50, (200, 30): 40, (100, 20): 99}
    tuner = Tuner(START, warmup_samples=0, max_samples=4, grid=GRID)
    measured = []
    run(tuner, lambda p: measured.append(p) or scores[(p.fusion_threshold_bytes, p.chunk_bytes)])
    # fusion first (200 beats 100), then chunk sizes with fusion at 200; (100, 20) is never tried
    assert [(p.fusion_threshold_bytes, p.chunk_bytes) for p in measured] == [
        (100, 10), (200, 10), (200, 20), (200, 30)]
    # the budget ended the sweep: nothing was measured twice, so the best single score wins
    assert tuner.chosen == Parameters(200, 0.0, 20, True)
    assert tuner.rows[-1].phase == "chosen" and tuner.rows[-1].score == 50


def test_confirmation_remeasures_the_leaders_and_a_lucky_sample_loses() -> None:
    # (200, 30) scores 90 once by luck, then 20; (200, 20) scores 50 every time.
    lucky = iter([90, 20, 20, 20])
    steady = {(100, 10): 10, (200, 10): 30, (200, 20): 50}

    def score(p: Parameters) -> int:
        key = (p.fusion_threshold_bytes, p.chunk_bytes)
        return next(lucky) if key == (200, 30) else steady[key]

    tuner = Tuner(START, warmup_samples=1, max_samples=10, grid=GRID)
    proposals = run(tuner, score)
    assert tuner.chosen == Parameters(200, 0.0, 20, True)
    assert proposals[-1] == Proposal(tuner.chosen, final=True)
    assert [p for p in proposals[:-1] if p is not None and p.final] == []
    confirm = [row for row in tuner.rows if row.phase == "confirm"]
    assert len(confirm) == 10 - 4  # the sweep took 4 of the 10 samples
    assert {(r.parameters.fusion_threshold_bytes, r.parameters.chunk_bytes) for r in confirm} >= {
        (200, 30), (200, 20)}
    assert tuner.median(Parameters(200, 0.0, 30, True)) == 20


def test_every_grid_value_is_tried_once_in_the_sweep_of_the_default_grid() -> None:
    tuner = Tuner(START, warmup_samples=0, max_samples=50)
    seen = []
    run(tuner, lambda p: seen.append(p) or 1)
    sweep = [row.parameters for row in tuner.rows if row.phase == "sweep"]
    assert len(sweep) == len(set(sweep)) == 1 + 4 + 3 + 4 + 1  # start, then each other grid value
    assert len(tuner.rows) == 50 + 1
    assert tuner.rows[-1].phase == "chosen"


def test_a_single_value_parameter_is_not_swept() -> None:
    tuner = Tuner(START, warmup_samples=0, max_samples=30,
                  grid={"chunk_bytes": (10, 20), "cache_enabled": ()})
    run(tuner, lambda p: p.chunk_bytes)
    assert {row.parameters.cache_enabled for row in tuner.rows} == {True}
    assert {row.parameters.fusion_threshold_bytes for row in tuner.rows} == {100}
    assert tuner.chosen == dataclasses.replace(START, chunk_bytes=20)


def test_proposal_is_none_while_the_parameters_stay() -> None:
    tuner = Tuner(START, warmup_samples=0, max_samples=3, grid={})
    assert tuner.add_sample(5, 1.0) is None  # nothing to sweep: the start is re-measured
    assert tuner.add_sample(6, 1.0) is None
    assert tuner.add_sample(7, 1.0) == Proposal(START, final=True)
    assert tuner.rows[-1].score == 6  # the median of 5, 6 and 7 B/s


def test_settled_tuner_refuses_samples_and_bad_arguments_are_named() -> None:
    tuner = Tuner(START, warmup_samples=0, max_samples=1, grid={})
    tuner.add_sample(1, 1.0)
    with pytest.raises(RuntimeError, match="settled on"):
        tuner.add_sample(1, 1.0)
    with pytest.raises(ValueError, match=r"max_samples >= 1.*max_samples=0"):
        Tuner(START, warmup_samples=0, max_samples=0)
    with pytest.raises(ValueError, match=r"grid names must be among.*\['chunk'\]"):
        Tuner(START, warmup_samples=0, max_samples=1, grid={"chunk": (1,)})
    with pytest.raises(ValueError, match="positive time. Got seconds=0"):
        Tuner(START, warmup_samples=0, max_samples=1).add_sample(1, 0)


def test_log_rows_render_as_csv() -> None:
    row = LogRow(3, "warmup", Parameters(1024, 0.002, 4096, False), 500, 0.25, 2000.0)
    fields = csv_line(row).split(",")
    assert len(fields) == len(LOG_COLUMNS)
    assert dict(zip(LOG_COLUMNS, fields)) == {
        "sample": "3", "phase": "warmup", "warmup": "1", "fusion_threshold_bytes": "1024",
        "cycle_time_ms": "2", "chunk_bytes": "4096", "cache_enabled": "0", "bytes_reduced": "500",
        "seconds": "0.250000", "score_bytes_per_second": "2000.0"}


def test_meter_counts_only_cycles_that_reduced_and_restarts() -> None:
    meter = Meter(2)
    assert meter.cycle(0, 0.0, 1.0) is None  # idle cycles before the first step start nothing
    assert meter.cycle(10, 2.0, 2.5) is None
    assert meter.cycle(0, 3.0, 3.5) is None
    assert meter.cycle(30, 4.0, 5.0) == (40, 3.0)  # from the first step's start to the last's end
    assert meter.cycle(10, 6.0, 6.5) is None
    meter.restart()
    assert meter.cycle(10, 7.0, 7.5) is None
    assert meter.cycle(10, 8.0, 9.0) == (20, 2.0)
    with pytest.raises(ValueError, match="steps=0"):
        Meter(0)


def test_tune_response_survives_the_wire_and_is_split_from_the_rest() -> None:
    proposal = Proposal(Parameters(2 << 20, 0.0005, 1 << 20, False), final=True)
    barrier = Response(ResponseKind.BARRIER, ("barrier.b",))
    decoded = decode_responses(encode_responses([barrier, tune_response(proposal)]))
    rest, received = split_tuning(decoded)
    assert rest == [barrier]
    assert received == proposal
    assert split_tuning([barrier]) == ([barrier], None)
    with pytest.raises(ValueError, match="expected a tune response"):
        read_tune_response(barrier)


def test_autotune_settings_read_both_names_and_refuse_zero_steps() -> None:
    from unison.config import load_settings
    from unison.errors import ConfigError

    settings = load_settings({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
                              "UNISON_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_LOG": "/tmp/x.csv"})
    assert (settings.autotune, settings.autotune_max_samples, settings.autotune_warmup_samples,
            settings.autotune_log, settings.autotune_steps_per_sample) == (True, 7, 0, "/tmp/x.csv", 10)
    with pytest.raises(ConfigError, match=r"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE must be at least 1\. "
                                          r"Got HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=0\."):
        load_settings({"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "0"})
    with pytest.raises(ConfigError, match=r"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES must be a non-negative"):
        load_settings({"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "many"})
