"""A broken job ends within a bound, naming who broke it; a process forked after init() leaves the job alone.

Bounds measured from the break: a stall is declared `STALL_SECONDS` (+ up to 1 s, the inspector's
period) after the stuck rank stopped submitting; a rank of a broken job waits at most
`GRACE_SECONDS` for every rank to reach its exit, then ends the job with MPI_Abort.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unison._job.failure import ALARM_SECONDS, GRACE_SECONDS

from ._jobs import BOUND_SECONDS, HERE, MPIEXEC, PYTHON, SCENARIO, assert_no_strays, run_job, unisonrun

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(120)]

STALL_SECONDS = 2
STALL_ENV = {"UNISON_STALL_CHECK_TIME_SECONDS": "1", "UNISON_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_SECONDS)}
STARTUP_SECONDS = 6.0  # starting Python, numpy and MPI on a loaded 2-core machine, and 3 steps
STALL_BOUND = STARTUP_SECONDS + STALL_SECONDS + 1 + 1  # interrupted at once: ends with the stall
BROKEN_BOUND = STARTUP_SECONDS + STALL_SECONDS + 1 + GRACE_SECONDS + 2  # waits out the exit agreement
FORK_SCENARIO = str(HERE / "_fork_scenario.py")
TORCH_SCENARIO = str(HERE / "_torch_scenario.py")
KERAS_SCENARIO = str(HERE / "_keras_scenario.py")
PROGRESS_SCENARIO = str(HERE / "_progress_scenario.py")


def launch(launcher: str, *args: str) -> list[str]:
    if launcher == "unisonrun":
        return unisonrun("-np", "2", PYTHON, *args)
    return [MPIEXEC, "-n", "2", PYTHON, *args]


# -- 1. a rank stuck in its own code while the others wait ------------------------------------------


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_rank_stuck_in_its_own_code_ends_the_stalled_job_named(tmp_path: Path, launcher: str) -> None:
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "stuck", "1"), env=STALL_ENV, deadline=90)
    assert done.returncode != 0, done.output
    # each rank's line says what stopped it in a few words (the report's title, ending in ':', did before)
    assert "StallError: the job stalled;" in done.output and "StallError: Stall:" not in done.output, done.output
    assert "rank 1 has not submitted: allreduce.grad.3" in done.output
    if launcher == "unisonrun":
        assert "unisonrun: the job stalled (found by rank 0" in done.output, done.output
        assert "Stopping the job: rank(s) [1] stalled for more than 2 s" in done.output
    # The stuck rank was interrupted (KeyboardInterrupt), so its finally: block ran too.
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"], done.output
    assert "MPI_Abort" not in done.output  # every rank reached its exit: no need to force it
    assert done.seconds < STALL_BOUND, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_rank_that_cannot_be_interrupted_after_a_stall_is_ended_with_mpi_abort(tmp_path: Path,
                                                                                  launcher: str) -> None:
    # The stuck rank ignores SIGINT and then holds the GIL in C: no interrupt and no timer thread can
    # end it. The waiting rank gives it GRACE_SECONDS to reach its exit, then calls MPI_Abort.
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "stuck_in_c", "1"), env=STALL_ENV, deadline=90)
    assert done.returncode != 0, done.output
    assert "rank 1 has not submitted: allreduce.grad.3" in done.output
    assert "not every rank reached its exit within 5 s" in done.output, done.output
    assert not (tmp_path / "finally-1").exists()
    assert done.seconds < BROKEN_BOUND, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_collective_called_on_one_rank_only_is_reported_as_a_deadlock_at_once(tmp_path: Path,
                                                                                launcher: str) -> None:
    # Rank 1 alone calls an unnamed allreduce and waits in it; rank 0 waits in the next step's named
    # one. Both main threads are blocked in unison, so neither can ever submit what the other waits
    # for: the job stops after UNISON_DEADLOCK_SECONDS (2 s), not after the 600 s stall shutdown.
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "metric", "1"), env={})
    assert done.returncode != 0, done.output
    # The report once: rank 0's log (and unisonrun's line); each rank one line saying where it waited.
    assert done.output.count("Deadlock: every rank that the pending collectives wait for is itself blocked") == 1, \
        done.output
    reporter = "unisonrun" if launcher == "unisonrun" else "rank 0"
    for rank, line in ((0, 66), (1, 60)):
        assert re.search(rf"unison: rank {rank} \([^)]*\) stopped at _scenario\.py:{line} in <module>: StallError: "
                         rf"the job deadlocked; {reporter} reports it\.", done.output), done.output
    assert "Traceback" not in done.output, done.output
    assert "rank 0 waits for allreduce.grad.3; has not submitted allreduce.noname.1 (unnamed allreduce #1)" \
        in done.output, done.output
    assert "rank 1 waits for allreduce.noname.1 (unnamed allreduce #1); has not submitted allreduce.grad.3" \
        in done.output
    if launcher == "unisonrun":
        assert "unisonrun: the job deadlocked (found by rank 0" in done.output, done.output
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"], done.output
    assert "MPI_Abort" not in done.output
    assert done.seconds < STARTUP_SECONDS + 2 + 1 + 2, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize(("mode", "ranks"), [("set", 3), ("async", 2)])
def test_ranks_that_keep_completing_collectives_beside_a_pending_one_are_no_deadlock(mode: str, ranks: int) -> None:
    # One collective stays pending for 6 s while the ranks missing from it loop other collectives:
    # every detail cycle sees their main threads blocked in unison, each time in a new wait. The
    # deadlock check (its default 2 s; it stopped such jobs after about 3 s) must let the job finish.
    done = run_job([MPIEXEC, "-n", str(ranks), PYTHON, PROGRESS_SCENARIO, mode, "6"],
                   env={"UNISON_DEADLOCK_SECONDS": "2"}, deadline=90)
    assert done.returncode == 0, done.output
    assert "Deadlock" not in done.output, done.output
    for rank in range(ranks):
        assert re.search(rf"rank {rank}: ok, \d+ calls", done.output), done.output


def test_a_stall_stops_ranks_inside_their_own_calls_with_the_stall_s_error() -> None:
    # Ranks 0 and 1 loop an allreduce in their process set, each call's cycle run on the main thread
    # itself, while rank 2 waits in a global one: the stall stops the job from inside those cycles.
    # Each rank raises StallError from its call; none gets a bare KeyboardInterrupt (whose SIGINT
    # exit mpiexec would report as a crash).
    done = run_job([MPIEXEC, "-n", "3", PYTHON, PROGRESS_SCENARIO, "stall", "0"], env=STALL_ENV, deadline=90)
    assert done.returncode != 0, done.output
    for rank, line in ((0, 45), (1, 45), (2, 49)):
        assert re.search(rf"unison: rank {rank} \([^)]*\) stopped at _progress_scenario\.py:{line} in <module>: "
                         r"StallError: the job stalled; rank 0 reports it\.", done.output), done.output
    assert "Traceback" not in done.output and "KeyboardInterrupt" not in done.output, done.output
    assert "MPI_Abort" not in done.output and "signal" not in done.output, done.output
    assert done.seconds < STALL_BOUND, done.seconds


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None,
                    reason="needs tensorflow and keras")
def test_a_collective_that_only_rank_0_calls_between_keras_steps_is_a_deadlock_at_once(tmp_path: Path) -> None:
    # Rank 1 waits in a train step: its gradients' allreduce waits in one of TensorFlow's threads while
    # its main thread waits in C for the step. That counts as blocked, so the job stops after
    # UNISON_DEADLOCK_SECONDS, not after the 60 s stall warning and the 600 s shutdown.
    done = run_job(unisonrun("-np", "2", PYTHON, KERAS_SCENARIO, str(tmp_path)), env={}, deadline=100)
    assert done.returncode == 1, done.output
    assert "unisonrun: the job deadlocked (found by rank 0" in done.output, done.output
    assert "rank 0 waits for allreduce.epoch_loss; has not submitted grouped_allreduce.DistributedGradients." \
        in done.output, done.output
    assert "rank 1 waits for grouped_allreduce.DistributedGradients." in done.output, done.output
    assert "Stall:" not in done.output  # no stall warning came first
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"], done.output
    assert_no_strays(tmp_path, 2)


# -- 2. a bounded exit whatever the state of MPI ----------------------------------------------------


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_frozen_peer_given_up_on_ends_the_job_instead_of_hanging_in_finalize(tmp_path: Path,
                                                                              launcher: str) -> None:
    # Rank 1 stops itself (SIGSTOP) in the middle of the job; rank 0's engine, waiting in the status
    # exchange, gives up after 2 s (as a detector of lost peers does), leaving that nonblocking
    # exchange pending. Without a bounded exit rank 0 hung in MPI_Finalize and the job never ended.
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "frozen", "1"), env={"FAULT_GIVE_UP_SECONDS": "2"})
    assert done.returncode != 0, done.output
    assert "AbortedError: rank 1 stopped answering" in done.output, done.output
    assert "not every rank reached its exit within 5 s" in done.output
    assert (tmp_path / "finally-0").exists()
    assert done.seconds < STARTUP_SECONDS + 2 + GRACE_SECONDS + 2, done.seconds
    assert_no_strays(tmp_path, 2)


def test_sigalrm_ends_a_process_of_a_broken_job_that_no_thread_can_end() -> None:
    # After the break, C code holds the GIL: the grace timer (a thread) cannot run; SIGALRM can.
    code = ("import ctypes; from unison._job import failure as _failure; _failure.job_broken('rank 1 was lost'); "
            "ctypes.PyDLL(None).sleep(60)")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=40)
    seconds = time.monotonic() - start
    assert proc.returncode == -14, (proc.returncode, proc.stderr)  # SIGALRM
    assert ALARM_SECONDS - 0.5 < seconds < ALARM_SECONDS + 5, seconds


def test_a_clean_abort_stays_quick_and_says_nothing_about_the_exit(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "raise", "1"])
    assert done.returncode != 0
    assert "AbortedError: rank 1 (" in done.output
    assert "reached its exit" not in done.output and "MPI_Abort" not in done.output, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


# -- 3. fork() after init() -------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_process_forked_after_init_gets_a_clear_error_and_leaves_the_job_alone(tmp_path: Path,
                                                                                launcher: str) -> None:
    done = run_job(launch(launcher, FORK_SCENARIO, str(tmp_path)))
    assert done.returncode == 0, done.output
    for how in ("normal", "exit3", "raise"):
        said = (tmp_path / f"child-{how}").read_text()
        assert said.startswith("HorovodInternalError: unison cannot be used in a process forked after "
                               "init(): this process (pid "), said
        assert "is a copy of rank 0, not a rank of the job" in said
        said = (tmp_path / f"child-init-{how}").read_text()  # init() again in the child: the same error
        assert said.startswith("HorovodInternalError: unison cannot be used in a process forked after "), said
    statuses = {how: int((tmp_path / f"status-{how}").read_text()) for how in ("normal", "exit3", "raise")}
    assert statuses == {"normal": 0, "exit3": 3, "raise": 1}
    assert "ValueError: the child failed" in done.output
    # The children sent nothing to the job: both ranks reduce together afterwards.
    assert [(tmp_path / f"after-{r}").read_text() for r in (0, 1)] == ["2.0 2.0", "2.0 2.0"]
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


# -- 4. the failure summary with torch --------------------------------------------------------------


def test_a_torch_collective_failure_is_summarized_at_the_users_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = run_job(unisonrun("-np", "2", PYTHON, TORCH_SCENARIO, str(tmp_path)), deadline=90)
    assert done.returncode != 0
    line = next(n for n, text in enumerate(Path(TORCH_SCENARIO).read_text().splitlines(), 1)
                if "the line the summary must show" in text)
    # One report of the error both ranks raised, each rank's call site on a line of its own.
    report = [text for text in done.output.splitlines() if text.startswith("unisonrun:")]
    assert len(report) == 3, done.output
    assert report[0].startswith("unisonrun: ranks ") and report[0].split(" raised one ")[1].startswith(
        "MismatchError: Mismatched ALLREDUCE tensor shapes for 'allreduce.grad'"), done.output
    for rank in (0, 1):
        assert any(text.startswith(f"unisonrun:   rank {rank} (") and text.endswith(f" at _torch_scenario.py:{line} in "
                                                                                 "<module>") for text in report), report
    assert_no_strays(tmp_path, 2)


# -- 6. torch.distributed on the unison backend --------------------------------------------------------

DDP_SCENARIO = str(HERE / "_ddp_scenario.py")


def since_fault(pid_dir: Path, name: str = "") -> float:
    """Seconds from the fault to now, or to when file `name` was written (torch's start-up on a loaded
    machine takes longer than numpy's, so bounds count from the fault)."""
    fault = float((pid_dir / "fault-time").read_text())
    return (pid_dir / name).stat().st_mtime - fault if name else time.time() - fault


def assert_raised_on_every_rank_within(pid_dir: Path, seconds: float) -> None:
    """Every rank's finally: block ran within `seconds` of the fault: the error reached each one."""
    for rank in (0, 1):
        assert since_fault(pid_dir, f"finally-{rank}") < seconds, (rank, since_fault(pid_dir, f"finally-{rank}"))


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_ddp_rank_out_of_step_is_a_mismatch_named_on_every_rank(tmp_path: Path, launcher: str) -> None:
    # gloo would reduce the metric with a gradient bucket or wait for its watchdog (30 minutes)
    done = run_job(launch(launcher, DDP_SCENARIO, str(tmp_path), "extra", "1"), env=STALL_ENV, deadline=90)
    assert done.returncode == 1, done.output
    assert "MismatchError: Mismatched" in done.output and "torch.pg." in done.output, done.output
    assert "[5]" in done.output and "rank [1]" in done.output, done.output
    if launcher == "unisonrun":  # rank 0's error came through DDP's hook and torch's autograd: one report still
        assert "unisonrun: ranks 1 and 0 raised one MismatchError: " in done.output, done.output
        assert "Traceback" not in done.output, done.output
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"], done.output
    assert_raised_on_every_rank_within(tmp_path, 1.0)
    assert since_fault(tmp_path) < BOUND_SECONDS
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["mpiexec", "unisonrun"])
def test_a_ddp_rank_that_never_issues_its_collective_is_named_by_the_stall_inspector(tmp_path: Path,
                                                                                    launcher: str) -> None:
    done = run_job(launch(launcher, DDP_SCENARIO, str(tmp_path), "stuck", "1"), env=STALL_ENV, deadline=90)
    assert done.returncode == 1, done.output
    assert "StallError: Stall:" in done.output and "rank 1 has not submitted: allreduce.torch.pg." in done.output
    if launcher == "unisonrun":
        assert "unisonrun: the job stalled (found by rank 0" in done.output, done.output
    assert_raised_on_every_rank_within(tmp_path, STALL_SECONDS + 1 + 1.0)
    assert since_fault(tmp_path) < STALL_SECONDS + 1 + BOUND_SECONDS
    assert_no_strays(tmp_path, 2)


def test_a_ddp_rank_that_raises_ends_the_job_named(tmp_path: Path) -> None:
    done = run_job(launch("unisonrun", DDP_SCENARIO, str(tmp_path), "raise", "1"), env=STALL_ENV, deadline=90)
    assert done.returncode == 1, done.output
    assert "unisonrun: rank 1 (" in done.output and "ValueError: injected failure at step 3" in done.output
    assert_raised_on_every_rank_within(tmp_path, 2.0)
    assert since_fault(tmp_path) < BOUND_SECONDS
    assert_no_strays(tmp_path, 2)
