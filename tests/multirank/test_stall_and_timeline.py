"""A rank that shuts down early is named to the others; the timeline is a valid Chrome trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

import unison as hvd
from unison.errors import ShutdownError


@pytest.fixture(autouse=True)
def fresh_job():
    hvd.shutdown()
    yield
    hvd.shutdown()


# The stall shutdown ends the job (every rank exits), so it is tested with whole jobs in
# tests/faults/test_lifecycle.py, not inside this suite.


@pytest.mark.min_ranks(2)
def test_a_rank_shutting_down_early_fails_the_others_with_its_rank(monkeypatch) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if rank == size - 1:
        hvd.shutdown()
    else:
        with pytest.raises(ShutdownError, match=rf"rank\(s\) \[{size - 1}\] called shutdown\(\)"):
            hvd.allreduce(np.ones(2), name="left.behind")


def test_timeline_file_is_valid_chrome_trace(monkeypatch, tmp_path) -> None:
    from mpi4py import MPI

    path = MPI.COMM_WORLD.bcast(str(tmp_path / "timeline.json"), root=0)
    monkeypatch.setenv("UNISON_TIMELINE", path)
    monkeypatch.setenv("UNISON_TIMELINE_MARK_CYCLES", "1")
    hvd.init()
    for _ in range(3):
        hvd.allreduce(np.ones(10), name="test_allreduce")
    hvd.allgather(np.ones(2), name="test_allgather")
    hvd.shutdown()
    MPI.COMM_WORLD.Barrier()
    with open(path) as f:  # every rank reads rank 0's file: one writer, valid JSON once closed
        events = json.load(f)
    text = json.dumps(events)
    for needle in ("allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "CYCLE_START",
                   "MPI_ALLREDUCE", "allgather.test_allgather"):
        assert needle in text, needle
    for event in events:
        assert event["ph"] in ("B", "E", "X", "M", "i"), event


def test_timeline_shows_an_operation_while_the_job_runs(monkeypatch, tmp_path) -> None:
    # Watched live: the file holds an operation's events while the job still runs, with no later
    # collective, stop_timeline() or shutdown() to push them out.
    import time

    from mpi4py import MPI

    path = MPI.COMM_WORLD.bcast(str(tmp_path / "live.json"), root=0)
    monkeypatch.setenv("HOROVOD_TIMELINE", path)
    monkeypatch.setenv("HOROVOD_TIMELINE_MARK_CYCLES", "1")
    # An idle engine runs no cycle for this long: only the timeline's own writer can write the file.
    monkeypatch.setenv("UNISON_IDLE_CYCLE_SECONDS", "30")
    hvd.init()
    hvd.allreduce(np.ones(4), name="watched")
    seen = ""
    if hvd.rank() == 0:
        deadline = time.monotonic() + 10  # a hang guard: the writer runs every 0.05 s
        needles = ("allreduce.watched", "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "CYCLE_START")
        while time.monotonic() < deadline:
            with open(path) as f:
                seen = f.read()
            if all(n in seen for n in needles):
                break
            time.sleep(0.01)
        assert all(n in seen for n in needles), seen[-2000:]
        assert not seen.rstrip().endswith("]")  # still open: the job runs
    hvd.barrier()


def test_dynamic_timeline(monkeypatch, tmp_path) -> None:
    from mpi4py import MPI

    path = MPI.COMM_WORLD.bcast(str(tmp_path / "dyn.json"), root=0)
    hvd.init()
    with pytest.raises(ValueError, match="Set UNISON_TIMELINE=DYNAMIC"):
        hvd.start_timeline(path)
    hvd.shutdown()
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init()
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(3), name="dyn")
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(path) as f:
            assert "allreduce.dyn" in json.dumps(json.load(f))
