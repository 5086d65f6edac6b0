"""MPICH's own report of a stop (its banner, Hydra's cleanup lines) kept out of the user's way under
unisonrun: the filter's decisions on hand-written streams, then real jobs with a rank killed."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults._jobs import BOUND_SECONDS, PYTHON, SCENARIO, run_job, unisonrun

from unison.launcher.mpi.messages import MessageFilter
from unison.launcher.supervision.supervise import JobOutcome, _settle_messages

pytestmark = pytest.mark.timeout(180)

RULE = b"=" * 83 + b"\n"
BANNER = (b"\n" + RULE
          + b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
          + b"=   PID 14605 RUNNING AT vm\n=   EXIT CODE: 9\n"
          + b"=   CLEANING UP REMAINING PROCESSES\n=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
          + RULE
          + b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
          + b"This typically refers to a problem with your application.\n"
          + b"Please see the FAQ page for debugging suggestions\n")
CLEANUP = (b"[mpiexec@vm] HYDT_bscu_wait_for_completion (lib/tools/bootstrap/utils/bscu_wait.c:76): one of the "
           b"processes terminated badly; aborting\n"
           b"[mpiexec@vm] main (ui/mpich/mpiexec.c:340): process manager error waiting for completion\n")


def _run(chunks: list[bytes]) -> tuple[bytes, bytes]:
    f = MessageFilter()
    passed = b"".join(f.feed(chunk) for chunk in chunks) + f.finish()
    return passed, b"".join(f.held)


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_the_banner_and_cleanup_lines_are_held_whatever_the_chunking(size: int) -> None:
    stream = b"epoch 1 loss 0.5\n" + BANNER + CLEANUP + b"after\n"
    passed, held = _run([stream[i:i + size] for i in range(0, len(stream), size)])
    assert passed == b"epoch 1 loss 0.5\nafter\n"
    assert held == BANNER + CLEANUP


def test_hydras_lines_of_a_forced_stop_are_held_and_its_question_passes() -> None:
    # A second Ctrl-C, which unisonrun passes on: Hydra's cleanup after it is MPICH's own report.
    asked = (b"[mpiexec@vm] Sending Ctrl-C to processes as requested\n"
             b"[mpiexec@vm] Press Ctrl-C again to force abort\n")
    forced = (b"[proxy:0@vm] main (/mpich-5.0.2/src/pm/hydra/proxy/pmip.c:123): demux engine error waiting for "
              b"event\n\nCtrl-C caught... cleaning up processes\n")
    passed, held = _run([asked + b"rank 0 except KeyboardInterrupt\n" + forced])
    assert passed == asked + b"rank 0 except KeyboardInterrupt\n\n"
    assert held == forced.replace(b"\n\n", b"\n")


def test_everything_else_passes_byte_for_byte() -> None:
    stream = (b"\n\nblank lines above\n" + RULE + b"a rule of the user's own\n" + b"==== short\n"
              + b"[1,0]<stdout>: tagged\n[mpiexec@vm] HYD_spawn (lib/tools/bootstrap/src/bsci_launch.c:1): "
              b"execvp error on file python9 (No such file or directory)\nno newline at the end")
    passed, held = _run([stream])
    assert passed == stream
    assert held == b""


def test_a_line_in_progress_passes_at_once_unless_it_may_open_a_held_line() -> None:
    f = MessageFilter()
    assert f.feed(b"progress 10%\r") == b"progress 10%\r"
    assert f.feed(b"progress 20%\r") == b"progress 20%\r"
    assert f.feed(b"\n") == b"\n"
    assert f.feed(b"[mpiexec@vm] HYDT_") == b""  # may be a cleanup line: wait for its end
    assert f.feed(b"bsci_wait_for_completion (x.c:1): launcher returned error\n") == b""
    assert f.feed(b"[rank 0] ok\n") == b"[rank 0] ok\n"


class _Relay:
    def __init__(self, held: list[bytes]) -> None:
        self.held = held

    def join(self, timeout_seconds: float) -> list[bytes]:
        return self.held


@pytest.mark.parametrize(("failures", "show", "printed"), [({1: "rank 1 failed"}, False, False),
                                                           ({}, False, True), ({1: "rank 1 failed"}, True, True)])
def test_held_lines_are_printed_only_where_unison_has_nothing_to_say(
        tmp_path: Path, failures: dict[int, str], show: bool, printed: bool) -> None:
    written: list[bytes] = []
    outcome = JobOutcome(9, dict(failures))
    _settle_messages([(_Relay([BANNER]), written.append)], outcome, tmp_path / "mpiexec.log", show)  # type: ignore[list-item]
    assert written == ([BANNER] if printed else [])
    assert (tmp_path / "mpiexec.log").exists() == (not printed)
    assert outcome.mpi_messages == (0 if printed else 1)


def test_a_killed_rank_is_named_without_mpich_banner(tmp_path: Path) -> None:
    done = run_job(unisonrun("-np", "2", PYTHON, SCENARIO, str(tmp_path), "sigkill", "1"))
    assert done.returncode == 128 + 9, done.output
    assert "unisonrun: rank 1 (" in done.output and "killed by signal 9 (SIGKILL)" in done.output, done.output
    for noise in ("BAD TERMINATION", "EXIT STRING", "HYDT_", "FAQ page"):
        assert noise not in done.output, done.output
    assert done.seconds < BOUND_SECONDS, done.seconds


def test_the_banner_goes_to_the_output_directory_and_debug_prints_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_job(unisonrun("-np", "2", "--output-filename", str(out), PYTHON, SCENARIO, str(tmp_path),
                             "sigkill", "1"))
    assert done.returncode == 128 + 9, done.output
    assert "BAD TERMINATION" not in done.output, done.output
    assert "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in (out / "mpiexec.log").read_text()
    (tmp_path / "debug").mkdir()
    done = run_job(unisonrun("-np", "2", "--log-level", "DEBUG", PYTHON, SCENARIO, str(tmp_path / "debug"),
                             "sigkill", "1"))
    assert "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in done.output, done.output
    assert done.output.rindex("BAD TERMINATION") < done.output.rindex("unisonrun: rank 1 ("), done.output
