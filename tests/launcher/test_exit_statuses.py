"""unisonrun's exit status says how the job ended: a rank's own sys.exit status, SIGTERM's 143, Ctrl-C's
130 (a second Ctrl-C reaching mpiexec), --timeout's 124 with every rank's finally: blocks run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from faults._jobs import BOUND_SECONDS, MPIEXEC, PYTHON, alive, assert_no_strays, run_job, unisonrun

pytestmark = pytest.mark.timeout(120)

PROGRAM = str(Path(__file__).resolve().parent / "_statuses_program.py")


def test_a_rank_that_calls_sys_exit_4_ends_the_job_with_status_4_and_is_named(tmp_path: Path) -> None:
    # MPICH's mpiexec ors the ranks' statuses: rank 1's 4 with rank 0's 1 (its ShutdownError) made 5.
    done = run_job(unisonrun("-np", "2", PYTHON, PROGRAM, str(tmp_path), "exit4"))
    assert done.returncode == 4, done.output
    ours = [line for line in done.output.splitlines() if line.startswith("unisonrun:")]
    assert len(ours) == 1 and ours[0].startswith("unisonrun: rank 1 (") and ours[0].endswith(
        "exited with status 4 after shutting unison down."), done.output
    # Rank 0, stopped waiting in its allreduce, says so in one line (no traceback): unisonrun reports it.
    assert "Traceback" not in done.output, done.output
    assert re.search(r"^unison: rank 0 \([^)]*\) stopped at _statuses_program\.py:\d+ in <module>: ShutdownError: "
                     r"rank\(s\) \[1\] shut unison down \(or exited\) while this rank had collectives pending; "
                     r"unisonrun reports it\.$", done.output, re.M), done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_under_plain_mpiexec_the_statuses_are_ored(tmp_path: Path) -> None:
    """What docs/launcher.md says plain mpiexec gives for the same job (it has no way to tell); rank 0, the
    lowest rank stopped by rank 1's exit, says why in one line."""
    done = run_job([MPIEXEC, "-n", "2", PYTHON, PROGRAM, str(tmp_path), "exit4"])
    assert done.returncode == 5, done.output
    assert "Traceback" not in done.output, done.output
    assert re.search(r"^unison: rank 0 \([^)]*\) stopped at _statuses_program\.py:\d+ in <module>: ShutdownError: "
                     r"unison has been shut down: rank\(s\) \[1\] called shutdown\(\) \(or exited\)", done.output,
                     re.M), done.output


def test_a_rank_that_finishes_early_is_named_and_told_to_call_join(tmp_path: Path) -> None:
    # Rank 1 runs out of data and exits 0 without hvd.join(); rank 0, waiting in its next allreduce,
    # raises ShutdownError and exits 1, saying where it waited. unisonrun names rank 1 and gives the fix.
    done = run_job(unisonrun("-np", "2", PYTHON, PROGRAM, str(tmp_path), "early"))
    assert done.returncode == 1, done.output
    ours = [line for line in done.output.splitlines() if line.startswith("unisonrun:")]
    assert len(ours) == 1, done.output
    assert re.fullmatch(r"unisonrun: rank 1 \([^,]+, pid \d+\) finished \(exit status 0\) while rank 0 still waited "
                        r"in a collective: a rank that runs out of data must call hvd\.join\(\) \(or every rank must "
                        r"run the same collectives\)\.", ours[0]), done.output
    assert re.search(r"^unison: rank 0 \([^)]*\) stopped at _statuses_program\.py:\d+ in <module>: ShutdownError: "
                     r"rank\(s\) \[1\] shut unison down \(or exited\) while this rank had collectives pending; "
                     r"unisonrun reports it\.$", done.output, re.M), done.output
    assert "Traceback" not in done.output, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_under_plain_mpiexec_the_rank_left_waiting_says_to_call_join(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, PROGRAM, str(tmp_path), "early"])
    assert done.returncode == 1, done.output
    line = next((line for line in done.output.splitlines() if line.startswith("unison: rank 0 (")), "")
    assert "ShutdownError: unison has been shut down: rank(s) [1] called shutdown() (or exited)" in line, done.output
    assert line.endswith("With uneven data, a rank that runs out of data first must call hvd.join() instead of "
                         "finishing."), done.output


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(unisonrun(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid-*"))) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "ranks did not start"
        time.sleep(0.05)
    return proc


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    return out


def test_sigterm_to_unisonrun_ends_the_job_with_143(tmp_path: Path) -> None:
    proc = _start(tmp_path, "-np", "2", PYTHON, PROGRAM, str(tmp_path), "loop")
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)
    assert proc.returncode == 143, out
    assert "unisonrun: terminated (SIGTERM); stopped every rank (exit status 143)." in out, out
    assert "interrupted" not in out, out
    assert time.monotonic() - start < BOUND_SECONDS
    assert_no_strays(tmp_path, 2)


def test_a_second_ctrl_c_reaches_mpiexec_and_ends_the_ranks_at_once(tmp_path: Path) -> None:
    # The ranks catch the first interrupt and sleep in their handlers; MPICH's mpiexec says "Press
    # Ctrl-C again to force abort", and the second Ctrl-C must reach it (--log-level DEBUG prints
    # Hydra's report of the forced stop, which unisonrun otherwise holds back).
    proc = _start(tmp_path, "-np", "2", "--log-level", "DEBUG", PYTHON, PROGRAM, str(tmp_path), "slow")
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    while len(list(tmp_path.glob("interrupted-*"))) < 2:
        assert time.monotonic() < deadline, "the first Ctrl-C did not reach the ranks"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out
    assert "Press Ctrl-C again to force abort" in out and "Ctrl-C caught... cleaning up processes" in out, out
    assert "unisonrun: interrupted; stopped every rank (exit status 130)." in out, out
    assert_no_strays(tmp_path, 2)
    assert not any(alive(int(p.read_text())) for p in tmp_path.glob("pid-*"))
