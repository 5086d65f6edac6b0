"""A failing, killed, vanished or interrupted rank ends the whole job quickly, non-zero, named."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ._jobs import BOUND_SECONDS, HERE, MPIEXEC, PYTHON, SCENARIO, alive, assert_no_strays, run_job, unisonrun

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("failing", [1, 0])
def test_uncaught_exception_under_unisonrun_stops_every_rank(tmp_path: Path, failing: int) -> None:
    done = run_job(unisonrun("-np", "2", PYTHON, SCENARIO, str(tmp_path), "raise", str(failing)))
    assert done.returncode != 0, done.output
    reason = f"rank {failing} ("
    assert f"unisonrun: {reason}" in done.output and "ValueError: injected failure at step 3" in done.output
    # One report: the failed rank's traceback, once, and unisonrun's line; the other rank says in one
    # line where it stopped and who reports, and every finally: block ran.
    other = 1 - failing
    assert [line for line in done.output.splitlines() if line.startswith("ValueError: injected")] == [
        "ValueError: injected failure at step 3"], done.output
    stopped = re.findall(rf"unison: rank {other} \([^)]*\) stopped at _scenario\.py:\d+ in <module>: AbortedError: "
                         rf"{re.escape(reason)}[^)]*\) failed \(ValueError\); unisonrun reports it\.", done.output)
    assert len(stopped) == 1, done.output
    assert "Traceback" not in done.output.replace("Traceback", "", 1), done.output  # the failed rank's only
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"]
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_uncaught_exception_under_plain_mpiexec_stops_every_rank(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "raise", "1"])
    assert done.returncode != 0, done.output
    assert "AbortedError: rank 1 (" in done.output and "ValueError: injected failure" in done.output
    # The failed rank reports (its traceback and its line), rank 0 points to it in one line.
    assert re.search(r"unison: rank 0 \([^)]*\) stopped at _scenario\.py:\d+ in <module>: AbortedError: rank 1 "
                     r"\([^)]*\) failed \(ValueError\); rank 1 reports it\.", done.output), done.output
    assert re.search(r"unison: rank 1 \([^)]*\) failed: ValueError: injected failure at step 3 at "
                     r"_scenario\.py:45 in <module>; stopping every rank\.", done.output), done.output
    assert done.output.count("Traceback") == 1, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_rank_printing_its_own_error_is_not_cut_off_by_the_abort(tmp_path: Path, launcher: str) -> None:
    # Rank 0 is inside its exception hook when rank 1's abort arrives: the interrupt used to break
    # into the hook ("Error in sys.excepthook"), and rank 0's report never ended.
    args = [PYTHON, str(HERE / "_slow_report_scenario.py"), str(tmp_path)]
    done = run_job(unisonrun("-np", "2", *args) if launcher == "unisonrun" else [MPIEXEC, "-n", "2", *args])
    assert done.returncode == 1, done.output
    for rank, what in ((1, "fails first"), (0, "fails second")):
        assert f"END REPORT of rank {rank} {what}" in done.output, done.output
    assert "Error in sys.excepthook" not in done.output and "JobInterrupt" not in done.output, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_survivor_outside_a_collective_is_interrupted(tmp_path: Path) -> None:
    done = run_job(unisonrun("-np", "2", PYTHON, SCENARIO, str(tmp_path), "sleeping", "1"))
    assert done.returncode != 0, done.output
    # Interrupted outside unison (JobInterrupt): one line, where it stopped and why, no traceback.
    assert re.search(r"unison: rank 0 \([^)]*\) stopped at _scenario\.py:\d+ in <module>: AbortedError: rank 1 "
                     r"\([^)]*\) failed \(ValueError\); unisonrun reports it\.", done.output), done.output
    assert "JobInterrupt" not in done.output, done.output
    assert (tmp_path / "finally-0").exists()  # interrupted with KeyboardInterrupt, so finally: ran
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize(("mode", "status"), [("sigkill", 128 + 9), ("exit0", 1)])
def test_rank_that_dies_mid_collective_ends_the_job_named(tmp_path: Path, mode: str, status: int) -> None:
    # 3 ranks: mpiexec kills the other two with SIGKILL, and its own status (9 either way) no longer
    # decides unisonrun's: the first failure's does.
    done = run_job(unisonrun("-np", "3", PYTHON, SCENARIO, str(tmp_path), mode, "1"))
    assert done.returncode == status, done.output
    assert "rank 1 (" in done.output and "ended without shutting unison down" in done.output, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 3)


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_rank_that_raises_while_the_others_sleep_ends_the_job_with_status_1_and_no_crash(
        tmp_path: Path, launcher: str) -> None:
    # The sleeping ranks are interrupted. A plain KeyboardInterrupt ended them by SIGINT, and mpiexec
    # or'ed that 2 with a SIGKILL's 9: "EXIT STRING: Segmentation fault (signal 11)", exit status 11.
    args = [PYTHON, SCENARIO, str(tmp_path), "sleeping", "1"]
    done = run_job(unisonrun("-np", "4", *args) if launcher == "unisonrun" else [MPIEXEC, "-n", "4", *args])
    assert done.returncode == 1, done.output
    assert "EXIT STRING" not in done.output and "BAD TERMINATION" not in done.output, done.output
    # (lines of several ranks may interleave: no count of whole lines; each rank's note is one write)
    for rank in (0, 2, 3):
        assert re.search(rf"unison: rank {rank} \([^)]*\) stopped at _scenario\.py:\d+ in <module>: AbortedError: "
                         r"rank 1 \([^)]*\) failed \(ValueError\)", done.output), done.output
    assert "KeyboardInterrupt" not in done.output, done.output
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == [f"finally-{r}" for r in range(4)], done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 4)


def test_sigint_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    proc = subprocess.Popen(unisonrun("-np", "2", PYTHON, SCENARIO, str(tmp_path), "none", "-1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid-*"))) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "ranks did not start"
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    seconds = time.monotonic() - start
    assert proc.returncode == 130, out
    assert "unisonrun: interrupted" in out
    assert seconds < BOUND_SECONDS, seconds
    assert_no_strays(tmp_path, 2)
    assert not any(alive(int(p.read_text())) for p in tmp_path.glob("pid-*"))


INIT_AND_REDUCE = "import numpy as np, unison; unison.init(); print('reduced', unison.allreduce(np.ones(2)))"


@pytest.mark.parametrize("variable, values", [("UNISON_CHUNK_BYTES", ("4194304", "1048576")),
                                              ("HOROVOD_CACHE_CAPACITY", ("1024", "0"))])
def test_ranks_with_different_job_wide_settings_are_refused_at_init(variable: str, values: tuple[str, str]) -> None:
    # MPMD launch: rank 1 gets another value. Each rank plans fusion and chunks its MPI calls itself,
    # so this would hang or mix up buffers later; init() refuses it on every rank instead.
    done = run_job([MPIEXEC, "-n", "1", "-env", variable, values[0], PYTHON, "-c", INIT_AND_REDUCE, ":",
                    "-n", "1", "-env", variable, values[1], PYTHON, "-c", INIT_AND_REDUCE])
    assert done.returncode != 0, done.output
    name = variable.replace("HOROVOD_", "UNISON_")
    want = f"{name} differs between ranks: {int(values[0])} on rank [0]; {int(values[1])} on rank [1]."
    assert done.output.count(want) >= 2, done.output  # said on every rank
    assert "reduced" not in done.output
    assert done.seconds < BOUND_SECONDS, done.seconds


@pytest.mark.parametrize("variant", ["exit", "_exit", "nowait"])
def test_a_rank_that_forked_a_child_then_exits_mid_run_is_named(variant: str) -> None:
    # the child's own exit must not stand for the rank's: the rank's keeper sees the rank end
    scenario = str(Path(__file__).resolve().parent / "_fork_exit_scenario.py")
    done = run_job(unisonrun("-np", "2", PYTHON, scenario, variant))
    assert done.returncode == 1, done.output
    assert "unisonrun: rank 1 (" in done.output, done.output
    assert "ended without shutting unison down (exited with status 0) while the job was running" in done.output
