"""Autotune across real processes: results stay exact while parameters change, every rank settles on
the same parameters at the same cycle, and rank 0's log holds one row per sample and the chosen one."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest

import unison as hvd
from unison.protocol.autotune import DEFAULT_GRID, LOG_COLUMNS

WARMUP, STEPS, MAX_SAMPLES = 1, 2, 14
MAX_STEPS = 600  # far more than (WARMUP + MAX_SAMPLES) * STEPS plus one cycle per change
SMALL = [np.arange(n, dtype=np.float32) for n in (3, 100, 1000, 5000)]  # fused together
LARGE = np.arange(600_000, dtype=np.float32) % 1000  # 2.4 MB: split into chunks of 1 or 2 MiB


@pytest.fixture(autouse=True)
def fresh_job():
    hvd.shutdown()
    yield
    hvd.shutdown()


@pytest.fixture
def autotune_log(monkeypatch, tmp_path) -> str:
    from mpi4py import MPI

    path: str = MPI.COMM_WORLD.bcast(str(tmp_path / "autotune.csv"), root=0)
    for name, value in {"UNISON_AUTOTUNE": "1", "UNISON_AUTOTUNE_WARMUP_SAMPLES": str(WARMUP),
                        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": str(STEPS),
                        "UNISON_AUTOTUNE_MAX_SAMPLES": str(MAX_SAMPLES),
                        "HOROVOD_AUTOTUNE_LOG": path}.items():
        monkeypatch.setenv(name, value)
    return path


def one_step(step: int) -> None:
    """A training-like step: small tensors in one group, a large one alone; exact sums checked."""
    rank, size = hvd.rank(), hvd.size()
    scale = sum(r + 1 for r in range(size))
    small = hvd.grouped_allreduce([t * (rank + 1) for t in SMALL], op=hvd.Sum, name="small")
    for got, base in zip(small, SMALL):
        np.testing.assert_array_equal(got, base * scale, err_msg=f"step {step}")
    large = hvd.allreduce(LARGE * (rank + 1) + step, op=hvd.Sum, name="large")
    np.testing.assert_array_equal(large, LARGE * scale + step * size, err_msg=f"step {step}")


def tune_until_settled() -> int:
    """Run steps until every rank reports autotune settled (decided together: a MIN over ranks)."""
    for step in range(MAX_STEPS):
        one_step(step)
        stats = hvd.statistics().autotune
        assert stats is not None
        settled = hvd.allreduce(np.array([stats.state == "settled"], np.int32), op=hvd.Min, name="settled")
        if settled[0]:
            return step
    raise AssertionError(f"autotune did not settle within {MAX_STEPS} steps: {hvd.statistics().autotune}")


def test_results_stay_exact_and_every_rank_settles_on_the_same_parameters(autotune_log) -> None:
    hvd.init()
    assert hvd.statistics().autotune is not None
    tune_until_settled()
    stats = hvd.statistics().autotune
    assert stats is not None
    everyone = hvd.allgather_object(dataclasses.asdict(stats))
    assert all(s == everyone[0] for s in everyone), everyone
    # Cache use was switched off and on at the same cycle everywhere: the caches went through the
    # same insertions and erasures (hits differ: the rank that submits first may find its entry).
    caches = hvd.allgather_object({k: v for k, v in dataclasses.asdict(hvd.statistics().cache).items()
                                   if k in ("puts", "erased", "evictions", "entries")})
    assert all(c == caches[0] for c in caches) and caches[0]["erased"] > 0, caches
    assert everyone[0]["state"] == "settled"
    # One change per sample whose parameters differ from the last, plus the settlement.
    assert 2 <= everyone[0]["changes"] <= MAX_SAMPLES + 1
    for _ in range(3):  # the chosen parameters keep working, and stay as they are
        one_step(1000)
    assert dataclasses.asdict(hvd.statistics().autotune) == everyone[0]

    rows = None
    if hvd.rank() == 0:
        with open(autotune_log, newline="") as f:
            rows = list(csv.reader(f))
    rows = hvd.broadcast_object(rows, root_rank=0)
    assert tuple(rows[0]) == LOG_COLUMNS
    records = [dict(zip(LOG_COLUMNS, row)) for row in rows[1:]]
    phases = [r["phase"] for r in records]
    assert phases[:WARMUP] == ["warmup"] * WARMUP
    assert [r["warmup"] for r in records[:WARMUP]] == ["1"] * WARMUP
    assert set(phases[WARMUP:-1]) <= {"sweep", "confirm"} and "sweep" in phases
    assert len(records) == WARMUP + MAX_SAMPLES + 1
    assert [r["sample"] for r in records[:-1]] == [str(i) for i in range(1, WARMUP + MAX_SAMPLES + 1)]
    chosen = records[-1]
    assert chosen["phase"] == "chosen"
    expected = everyone[0]["parameters"]
    assert (int(chosen["fusion_threshold_bytes"]), float(chosen["cycle_time_ms"]) / 1000,
            int(chosen["chunk_bytes"]), chosen["cache_enabled"] == "1") == (
        expected["fusion_threshold_bytes"], pytest.approx(expected["cycle_time_seconds"]),
        expected["chunk_bytes"], expected["cache_enabled"])
    # The sweep tried every value of every grid while the results above stayed exact.
    tried = {column: {r[column] for r in records[:-1]} for column in LOG_COLUMNS}
    assert {str(v) for v in DEFAULT_GRID["chunk_bytes"]} <= tried["chunk_bytes"]
    assert {"0", "1"} == tried["cache_enabled"]
    assert len(tried["cycle_time_ms"]) == len(DEFAULT_GRID["cycle_time_seconds"])
    for r in records[:-1]:
        assert int(r["bytes_reduced"]) > 0 and float(r["score_bytes_per_second"]) > 0, r


def test_without_autotune_the_parameters_are_the_settings() -> None:
    hvd.init()
    assert hvd.statistics().autotune is None
    one_step(0)
    assert hvd.statistics().autotune is None
