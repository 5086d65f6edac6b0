"""A rank that stops answering (frozen by SIGSTOP, or gone with os._exit) is named by the others, and the job ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from unison._job.failure import GRACE_SECONDS
from unison.backends._liveness import ABSENT_PROBES, PROBE_WINDOW_SECONDS, probe_window

from ._jobs import MPIEXEC, PYTHON, SCENARIO, assert_no_strays, run_job, unisonrun

pytestmark = pytest.mark.timeout(90)
PEER_TIMEOUT = 2.0
ENV = {"UNISON_PEER_TIMEOUT_SECONDS": str(PEER_TIMEOUT)}
# detection (the wait, then the probe's window), the exit agreement's grace, and start-up under load
DATA_PLANE_SCENARIO = str(Path(__file__).resolve().parent / "_data_plane_scenario.py")
BOUND = PEER_TIMEOUT + probe_window(PEER_TIMEOUT) + GRACE_SECONDS + 10.0


@pytest.mark.parametrize("launch", ["mpiexec", "unisonrun"])
def test_frozen_rank_is_named_and_the_job_ends(tmp_path: Path, launch: str) -> None:
    args = [PYTHON, SCENARIO, str(tmp_path), "frozen", "1"]
    cmd = [MPIEXEC, "-n", "2", *args] if launch == "mpiexec" else unisonrun("-np", "2", *args)
    done = run_job(cmd, env=ENV)
    assert done.returncode != 0, done.output
    assert (f"AbortedError: rank 1 stopped answering: rank 0 waited {PEER_TIMEOUT:.0f} s for rank 1 in a "
            "control exchange and rank 1 did not answer a liveness probe") in done.output, done.output
    assert done.seconds < BOUND, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("aggregation", ["1", "0"])
def test_frozen_rank_under_grpc_is_named_and_the_job_ends_by_itself(tmp_path: Path, aggregation: str) -> None:
    env = {"UNISON_CONTROLLER": "grpc", "UNISON_HEARTBEAT_TIMEOUT_SECONDS": str(PEER_TIMEOUT),
           "UNISON_SERVICE_HOST_AGGREGATION": aggregation}
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "frozen", "1"], env=env)
    assert done.returncode != 0, done.output
    assert "AbortedError: rank 1 (" in done.output and "sent no heartbeat for" in done.output, done.output
    assert done.seconds < BOUND, done.seconds
    assert_no_strays(tmp_path, 2)


def test_the_probe_window_is_short_whatever_the_peer_timeout() -> None:
    # A frozen rank under the default 10 s timeout ends the job 10 + 3 + 5 s after the fault (18 s;
    # docs/launcher.md), not 10 + 10 + 5: the answer comes from a thread that polls every 50 ms.
    assert probe_window(10.0) == PROBE_WINDOW_SECONDS == 3.0
    assert probe_window(PEER_TIMEOUT) == PEER_TIMEOUT
    assert 10.0 + probe_window(10.0) + GRACE_SECONDS <= 18.0


def test_rank_gone_with_os_exit_under_plain_mpiexec_is_said_and_the_job_ends_at_once(tmp_path: Path) -> None:
    """What plain mpiexec does: MPICH's mpiexec kills every other rank (SIGKILL, 0.08 s later in the runs
    measured) as soon as one exits without finalizing MPI, and its status may be that rank's, 0 here; no
    rank can report it. Each rank's exit watcher (a process outside it) says that it ended without a word,
    so the job is not a silent success; it ends at once, leaving nothing running. Under unisonrun the
    first rank is named and its status decides (tests/faults/test_failures.py); docs/launcher.md says so."""
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "exit0", "1"], env=ENV)
    assert "unison: rank 1 (" in done.output, done.output
    line = next(x for x in done.output.splitlines() if x.startswith("unison: rank 1 ("))
    assert "ended without shutting unison down and without reporting an error" in line, done.output
    assert done.seconds < 10, done.seconds  # never a hang
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launch", ["mpiexec", "unisonrun"])
def test_exit_watchers_say_nothing_of_a_job_that_ends_well_or_explains_its_end(tmp_path: Path, launch: str) -> None:
    args = [PYTHON, SCENARIO, str(tmp_path), "raise", "1"]
    cmd = [MPIEXEC, "-n", "2", *args] if launch == "mpiexec" else unisonrun("-np", "2", *args)
    done = run_job(cmd, env=ENV)
    assert done.returncode == 1, done.output
    assert "ValueError" in done.output or "RuntimeError" in done.output, done.output
    assert "ended without shutting unison down and without reporting" not in done.output, done.output
    program = tmp_path / "ok.py"
    program.write_text("import numpy as np, unison\nunison.init()\nunison.allreduce(np.ones(2), name='x')\n")
    done = run_job([MPIEXEC, "-n", "2", PYTHON, str(program)], env=ENV)
    assert done.returncode == 0, done.output
    assert "ended without shutting unison down" not in done.output, done.output


def test_rank_frozen_inside_a_data_plane_call_is_named_and_the_job_ends(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, DATA_PLANE_SCENARIO, str(tmp_path), "frozen"], env=ENV)
    assert done.returncode != 0, done.output
    assert ("unison: rank 1 stopped answering: rank 0 has been in a data-plane collective with rank 1"
            in done.output), done.output
    assert done.seconds < BOUND, done.seconds
    assert_no_strays(tmp_path, 2)


def test_rank_whose_collective_failed_before_its_transport_is_named_and_the_job_ends(tmp_path: Path) -> None:
    # Rank 1's executor raised before MPI's allreduce, and rank 1 went on to its next collective: it is
    # alive and answers probes from that collective's control exchange, but never joins the call rank 0
    # is blocked in. Without the check both
    # ranks waited for ever, and nothing was printed.
    done = run_job([MPIEXEC, "-n", "2", PYTHON, DATA_PLANE_SCENARIO, str(tmp_path)], env=ENV)
    assert done.returncode != 0, done.output
    assert "rank 1 caught HorovodInternalError" in done.output and "injected" in done.output, done.output
    assert ("unison: rank 1 never joined a data-plane collective that every member had agreed to run: rank 0 "
            "has been in it for") in done.output, done.output
    assert f"answered {ABSENT_PROBES + 1} liveness probes from a control exchange, without having completed" in done.output
    assert "finished" not in done.output, done.output
    assert done.seconds < BOUND + PROBE_WINDOW_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("fault", ["refused", "frozen"])
def test_a_stuck_data_plane_call_is_looked_at_again_every_timeout(tmp_path: Path, fault: str) -> None:
    # Rank 1 is busy for 5 s, alive and outside any control exchange, past the 2 s timeout: the first
    # look finds nothing wrong. Then its collective fails before the transport (it goes on to its next
    # control exchange) or it freezes. Looked at once per call, rank 0 waited for ever; a later look names it.
    done = run_job([MPIEXEC, "-n", "2", PYTHON, DATA_PLANE_SCENARIO, str(tmp_path), f"late-{fault}"], env=ENV,
                   deadline=60.0)
    assert done.returncode != 0, done.output
    named = {"refused": "unison: rank 1 never joined a data-plane collective",
             "frozen": "unison: rank 1 stopped answering: rank 0 has been in a data-plane collective"}[fault]
    assert named in done.output, done.output
    assert "finished" not in done.output, done.output
    assert done.seconds < BOUND + 5.0 + PROBE_WINDOW_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_rank_that_reaches_the_transport_late_but_alive_is_waited_for(tmp_path: Path) -> None:
    # Rank 1 joins rank 0's data-plane call 5 s late, past the 2 s peer timeout: its probes' answers
    # come from outside any control exchange (it is still on its way to the call), so rank 0 waits.
    done = run_job([MPIEXEC, "-n", "2", PYTHON, DATA_PLANE_SCENARIO, str(tmp_path), "slow"], env=ENV)
    assert done.returncode == 0, done.output
    assert "rank 0 finished" in done.output and "rank 1 finished" in done.output, done.output
    assert "never joined" not in done.output and "MPI_Abort" not in done.output, done.output


def test_members_that_completed_their_part_of_a_late_collective_are_not_taken_for_absent(tmp_path: Path) -> None:
    # Rank 2 joins an alltoall 9 s late (the 2 s timeout and the probes after it have passed) and sends
    # rank 1 nothing: rank 1 completes its part and waits in
    # its next cycle's control exchange while rank 0 still waits for rank 2's rows. Rank 1 completed the
    # call, so it is not taken for a member that never joined it.
    done = run_job([MPIEXEC, "-n", "3", PYTHON, DATA_PLANE_SCENARIO, str(tmp_path), "uneven"], env=ENV)
    assert done.returncode == 0, done.output
    for rank in range(3):
        assert f"rank {rank} alltoall done" in done.output and f"rank {rank} finished" in done.output, done.output
    assert "never joined" not in done.output and "MPI_Abort" not in done.output, done.output
