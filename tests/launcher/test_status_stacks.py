"""`unisonrun --status` prints each rank's main-thread stack: where it is in the user's code, then its frames,
with the MPI control plane (no live table: it still says how to get one) and with the gRPC one."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from faults._jobs import PYTHON, run_job, unisonrun

pytestmark = pytest.mark.timeout(150)

JOB = """
import os, sys, time, numpy as np, unison
unison.init()
go = sys.argv[1]


def wait_for_go():
    while not os.path.exists(go):
        time.sleep(0.05)


if unison.rank() == 0:
    unison.allreduce(np.ones(2), name="held")  # waits for rank 1
else:
    wait_for_go()
    unison.allreduce(np.ones(2), name="held")
unison.shutdown()
"""


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(JOB.splitlines(), 1) if text in line)


@pytest.mark.parametrize("controller", ["mpi", "grpc"])
def test_status_prints_where_each_rank_is_and_its_stack(tmp_path: Path, controller: str) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "UNISON_CONTROLLER": controller}
    env.pop("UNISON_SECRET", None)
    (tmp_path / "run").mkdir(mode=0o700)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    go = tmp_path / "go"
    job = subprocess.Popen(unisonrun("-np", "2", PYTHON, str(script), str(go)), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            status = run_job(unisonrun("--status"), env=env)
            if "rank 1 (" in status.output and "wait_for_go" in status.output:
                break
            assert time.monotonic() < deadline and job.poll() is None, status.output
            time.sleep(0.5)
    finally:
        go.write_text("")
        out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    lines = status.output.splitlines()
    waiting = line_of('unison.allreduce(np.ones(2), name="held")  # waits for rank 1')
    first = next(i for i, line in enumerate(lines) if line.startswith("rank 0 ("))
    assert lines[first].endswith(f"main thread at job.py:{waiting} in <module>, innermost frame first:"), lines
    assert f"    {script}:{waiting} in <module>" in lines[first + 1:], lines  # its frames follow, unison's first
    rank1 = next(i for i, line in enumerate(lines) if line.startswith("rank 1 ("))
    assert lines[rank1].endswith(f"main thread at job.py:{line_of('time.sleep(0.05)')} in wait_for_go <- "
                                 f"job.py:{line_of('    wait_for_go()')} in <module>, innermost frame first:"), lines
    assert lines[rank1 + 1] == f"    {script}:{line_of('time.sleep(0.05)')} in wait_for_go", lines
    if controller == "mpi":
        assert status.returncode == 2 and "start it with UNISON_CONTROLLER=grpc" in status.output, status.output
    else:
        assert status.returncode == 0 and "job of 2 ranks" in status.output, status.output
