"""Under torchrun the rank that failed first is the "Root Cause" torchrun names: each rank leaves
torchelastic's error file, the ranks stopped because of it one second later; of a mismatch, the rank that
made the odd call; of a stall, rank 0 with the report (real processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    import unison
    unison.init()
    rank, failing = unison.rank(), int(sys.argv[2])
    Path(sys.argv[1], f"error-file-{rank}").write_text(os.environ["TORCHELASTIC_ERROR_FILE"])
    unison.allreduce(np.ones(2), name="first")
    if rank == failing and sys.argv[3] == "raise":
        time.sleep(0.5)  # the others wait in the next collective
        raise ValueError("injected failure on the failing rank")
    if rank == failing and sys.argv[3] == "stall":
        time.sleep(60)  # in its own code: the others stall in the next collective
    if rank == failing and sys.argv[3] == "mismatch":
        unison.allreduce(np.ones(3), name="second")  # the odd call: another shape, on an earlier line
    unison.allreduce(np.ones(2), name="second")
""")


def run_torchrun(tmp_path: Path, n: int, failing: int, mode: str, **env: str) -> tuple[str, str]:
    """The job's output and what torchrun names as its root cause."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                           str(program), str(tmp_path), str(failing), mode],
                          capture_output=True, text=True, timeout=150, env={**environment, **env})
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    return output, output.split("Root Cause (first observed failure):", 1)[-1]


def error_files(tmp_path: Path, n: int) -> tuple[dict[int, dict], dict[int, int]]:
    data = {rank: json.loads(Path((tmp_path / f"error-file-{rank}").read_text()).read_text()) for rank in range(n)}
    return data, {rank: int(d["message"]["extraInfo"]["timestamp"]) for rank, d in data.items()}


def names_rank(root: str, rank: int) -> bool:
    return re.search(rf"^\s*rank\s*: {rank} \(local_rank: {rank}\)", root, re.MULTILINE) is not None


@pytest.mark.parametrize(("n", "failing"), [(2, 1), (3, 2)])
def test_torchrun_names_the_rank_that_failed_as_the_root_cause(tmp_path: Path, n: int, failing: int) -> None:
    output, root = run_torchrun(tmp_path, n, failing, "raise")
    assert names_rank(root, failing), output[-3000:]
    assert "ValueError: injected failure on the failing rank" in root, output[-3000:]
    # What each rank left: the failed rank its own error, the others the stop one second later.
    data, stamps = error_files(tmp_path, n)
    assert data[failing]["message"]["message"] == "ValueError: injected failure on the failing rank"
    for rank in set(range(n)) - {failing}:
        assert data[rank]["message"]["message"].startswith(f"AbortedError: rank {failing} ("), data[rank]
        assert stamps[rank] > stamps[failing], stamps


@pytest.mark.parametrize(("n", "failing"), [(2, 1), (3, 2)])
def test_of_a_mismatch_torchrun_names_the_rank_that_made_the_odd_call(tmp_path: Path, n: int, failing: int) -> None:
    # Every rank raises the MismatchError; the odd one out (as unisonrun names it first) is the cause.
    output, root = run_torchrun(tmp_path, n, failing, "mismatch")
    assert names_rank(root, failing), output[-3000:]
    assert "MismatchError: Mismatched ALLREDUCE tensor shapes for 'allreduce.second'" in root, output[-3000:]
    data, stamps = error_files(tmp_path, n)
    for rank in set(range(n)) - {failing}:
        assert data[rank]["message"]["message"].startswith("MismatchError: "), data[rank]
        assert stamps[rank] > stamps[failing], stamps


def test_of_a_stall_torchrun_names_rank_0_which_found_it_with_the_report(tmp_path: Path) -> None:
    output, root = run_torchrun(tmp_path, 2, 1, "stall", UNISON_STALL_CHECK_TIME_SECONDS="1",
                                UNISON_STALL_SHUTDOWN_TIME_SECONDS="2")
    assert names_rank(root, 0), output[-3000:]
    assert re.search(r"rank 1 has not submitted: allreduce\.second \(waiting [\d.]+ s, submitted by ranks \[0\]\); "
                     r"its main thread is at program\.py:\d+ in <module>", root), output[-3000:]
    assert "Stopping the job: rank(s) [1] stalled for more than 2 s" in root, output[-3000:]
    _, stamps = error_files(tmp_path, 2)
    assert stamps[1] > stamps[0], stamps
