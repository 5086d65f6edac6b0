"""The launcher's pure decisions: whom to blame, how -x names reach mpiexec, which programs it refuses."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from unison.errors import LaunchError
from unison.launcher.mpi.mpiexec import MpiExec
from unison.launcher.mpi.program import check_program
from unison.launcher.mpi.variables import env_pairs, name_flags
from unison.launcher.supervision.blame import Markers, blame, finished_early, read_markers
from unison.launcher.supervision.deaths import DeathWatch
from unison.launcher.supervision.supervise import JobOutcome, exit_status, own_ends

pytestmark = pytest.mark.timeout(60)

TWO = {0: ("h", 10), 1: ("h", 11)}


def test_the_rank_whose_keeper_wrote_first_is_named_whatever_the_kernel_order() -> None:
    # Rank 1 died; mpiexec then killed rank 0 and its keeper (no ended-0). The kernel reported
    # rank 0's death first.
    seen = Markers(started=dict(TWO), ended={1: (11, -9)}, written_ns={("ended", 1): 5})
    assert blame(seen, [[0], [1]], {}, "h") == {
        1: "rank 1 (h, pid 11) ended without shutting unison down (killed by signal 9 (SIGKILL)) while the "
           "job was running."}


def test_ended_markers_are_ordered_by_the_time_they_were_written() -> None:
    seen = Markers(started=dict(TWO), ended={0: (10, 1), 1: (11, -9)},
                   written_ns={("ended", 0): 7, ("ended", 1): 3})
    assert list(blame(seen, [], {}, "h")) == [1]


def test_without_keepers_the_first_death_is_named() -> None:
    seen = Markers(started=dict(TWO))
    assert list(blame(seen, [[1], [0]], {}, "h")) == [1]
    both = blame(seen, [[0, 1]], {}, "h")
    assert list(both) == [0] and "rank 0 (h, pid 10), rank 1 (h, pid 11)" in both[0]
    assert "their order is unknown" in both[0]


def test_an_uncaught_exception_is_named_with_its_reason_and_its_consequences_are_not() -> None:
    seen = Markers(started=dict(TWO), failed={1: "rank 1 (h, pid 11) failed: ValueError: x"},
                   ended={0: (10, 1), 1: (11, 1)},
                   written_ns={("failed", 1): 1, ("ended", 1): 2, ("ended", 0): 3})
    assert blame(seen, [[1], [0]], {}, "h") == {1: "rank 1 (h, pid 11) failed: ValueError: x"}


def test_ranks_ending_after_a_known_failure_are_not_named() -> None:
    seen = Markers(started=dict(TWO), ended={0: (10, -9)}, written_ns={("ended", 0): 9})
    assert blame(seen, [[0]], {1: "rank 1 died"}, "h") == {}


def test_orderly_ends_and_programs_without_unison_are_no_failures() -> None:
    seen = Markers(started=dict(TWO), finished={0, 1}, ended={0: (10, 0), 1: (11, 0)},
                   written_ns={("ended", 0): 1, ("ended", 1): 2})
    assert blame(seen, [[0], [1]], {}, "h") == {}
    plain = Markers(ended={0: (10, 0), 1: (11, 0)}, written_ns={("ended", 0): 1, ("ended", 1): 2})
    assert blame(plain, [], {}, "h") == {}
    crashed = Markers(ended={1: (11, 3)}, written_ns={("ended", 1): 1})
    assert blame(crashed, [], {}, "h") == {1: "rank 1 (h, pid 11) exited with status 3 before unison.init()."}


def test_a_rank_that_shut_down_and_exited_non_zero_is_named_and_the_peers_it_stopped_are_not() -> None:
    # Rank 1 called sys.exit(4); rank 0's uncaught ShutdownError made it exit 1, and its keeper wrote
    # ended-0 first (marker times have the kernel's coarse clock: ties are common).
    seen = Markers(started=dict(TWO), finished={0, 1}, after_peer={0}, ended={0: (10, 1), 1: (11, 4)},
                   written_ns={("finished", 1): 1, ("finished", 0): 1, ("ended", 0): 4, ("ended", 1): 5})
    assert blame(seen, [[0], [1]], {}, "h") == {1: "rank 1 (h, pid 11) exited with status 4 after shutting unison down."}
    assert exit_status(JobOutcome(5, blame(seen, [], {}, "h"), ended={0: 1, 1: 4})) == 4
    # An elastic rank's stop for a host change is no failure.
    elastic = Markers(started=dict(TWO), finished={0, 1}, ended={0: (10, 75), 1: (11, 75)},
                      written_ns={("finished", 1): 1, ("finished", 0): 2, ("ended", 0): 3, ("ended", 1): 4})
    assert blame(elastic, [], {}, "h") == {}


def test_ranks_that_finished_while_others_waited_are_named_when_no_rank_failed() -> None:
    # Rank 1 ran out of data and exited 0; ranks 0 and 2 raised ShutdownError waiting for it and exited 1.
    three = {**TWO, 2: ("h", 12)}
    seen = Markers(started=dict(three), finished={0, 1, 2}, after_peer={0, 2},
                   ended={0: (10, 1), 1: (11, 0), 2: (12, 1)},
                   written_ns={("finished", 1): 1, ("ended", 1): 2, ("finished", 0): 3, ("ended", 0): 4})
    assert blame(seen, [[1], [0], [2]], {}, "h") == {}  # no failure of its own...
    assert finished_early(seen) == (  # ...but the job failed: the launcher says why
        "rank 1 (h, pid 11) finished (exit status 0) while ranks 0 and 2 still waited in a collective: a rank that "
        "runs out of data must call hvd.join() (or every rank must run the same collectives).")
    outcome = JobOutcome(1, {}, ended={0: 1, 1: 0, 2: 1}, early=finished_early(seen) or "")
    assert outcome.summary() == f"unisonrun: {outcome.early}" and exit_status(outcome) == 1
    # Two ranks finished, one of them on a host without a keeper (no exit status seen).
    both = Markers(started=dict(three), finished={0, 1, 2}, after_peer={0}, ended={0: (10, 1), 1: (11, 0)})
    assert finished_early(both) == (
        "rank 1 (h, pid 11) and rank 2 (h, pid 12) finished while rank 0 still waited in a collective: a rank that "
        "runs out of data must call hvd.join() (or every rank must run the same collectives).")


def test_without_a_rank_left_waiting_or_one_that_finished_nothing_is_said() -> None:
    orderly = Markers(started=dict(TWO), finished={0, 1}, ended={0: (10, 0), 1: (11, 0)})
    assert finished_early(orderly) is None
    exited_4 = Markers(started=dict(TWO), finished={0, 1}, after_peer={0}, ended={0: (10, 1), 1: (11, 4)})
    assert finished_early(exited_4) is None  # `blame` names rank 1 with its status
    caught = Markers(started=dict(TWO), finished={0, 1}, after_peer={0}, ended={0: (10, 0), 1: (11, 0)})
    assert finished_early(caught) is None  # rank 0 ended well after all
    # A failure of its own is named instead, and comes alone.
    outcome = JobOutcome(1, {1: "rank 1 (h, pid 11) failed: ValueError: x"}, early="ignored")
    assert outcome.summary() == "unisonrun: rank 1 (h, pid 11) failed: ValueError: x"


def test_markers_are_read_from_their_files(tmp_path: Path) -> None:
    (tmp_path / "started-1").write_text("h 11\n")
    (tmp_path / "ended-1").write_text("11 -9\n")
    (tmp_path / "finished-0").write_text("\n")
    (tmp_path / "finished-2").write_text("after a peer's shutdown\n")
    (tmp_path / "failed-0").write_text("why\n")
    (tmp_path / "rank.0.stdout").write_text("output, not a marker\n")
    seen = read_markers(tmp_path)
    assert seen.started == {1: ("h", 11)} and seen.ended == {1: (11, -9)}
    assert seen.finished == {0, 2} and seen.after_peer == {2} and seen.failed == {0: "why"}
    assert set(seen.written_ns) == {("started", 1), ("ended", 1), ("finished", 0), ("finished", 2), ("failed", 0)}
    assert read_markers(tmp_path / "gone") == Markers()


def test_the_timeout_is_the_first_line_and_stopped_ranks_are_no_failures() -> None:
    outcome = JobOutcome(-15, {}, timed_out=True, timeout=5.0)
    assert outcome.summary() == "unisonrun: the job ran past --timeout 5 s; stopped every rank (exit status 124)."
    outcome.announced = True
    assert outcome.summary() == ""


@pytest.mark.parametrize(("returncode", "ended", "expected"), [
    (11, {0: -9, 1: 1, 2: 2, 3: 1}, 1),  # mpiexec's or of 9 and 2: a crash that never happened
    (9, {1: -9, 0: -9}, 137),  # the first failure was killed by SIGKILL: as a shell says it
    (9, {1: 0, 0: -9, 2: -9}, 1),  # os._exit(0) while the job ran is a failure all the same
    (9, {1: 3, 0: -9}, 3),  # the failed rank's own status
    (14, {}, 14),  # no keeper record for that rank (another host): mpiexec's word
])
def test_the_exit_status_is_the_first_failures_own(returncode: int, ended: dict[int, int], expected: int) -> None:
    outcome = JobOutcome(returncode, {1: "rank 1 failed", 0: "rank 0 stopped too"}, ended=ended)
    assert exit_status(outcome) == expected


def test_a_rank_the_launcher_killed_after_its_failure_keeps_its_own_exit_status() -> None:
    # Rank 0 raised (named), and the launcher killed it before it finished exiting (an elastic launch
    # kills at once): its keeper then saw SIGKILL, which is the launcher's doing, not the rank's.
    ended = own_ends({0: (10, -9), 1: (11, 3)}, killed=[10, 12])
    assert ended == {1: 3}
    assert exit_status(JobOutcome(-9, {0: "rank 0 (h, pid 10) failed: ValueError: x"}, ended=ended)) == 1
    # A rank that died of SIGKILL by itself (the kernel's OOM killer) keeps its 137.
    assert exit_status(JobOutcome(-9, {0: "rank 0 killed"}, ended=own_ends({0: (10, -9)}, killed=[]))) == 137


def test_interrupt_and_timeout_outrank_the_failures() -> None:
    assert exit_status(JobOutcome(9, {1: "x"}, ended={1: -9}, interrupted=True)) == 130
    terminated = JobOutcome(9, {1: "x"}, ended={1: -9}, interrupted=True, signal=signal.SIGTERM)
    assert exit_status(terminated) == 143
    assert JobOutcome(-15, {}, interrupted=True, signal=signal.SIGTERM).summary() == (
        "unisonrun: terminated (SIGTERM); stopped every rank (exit status 143).")
    assert exit_status(JobOutcome(9, {1: "x"}, ended={1: -9}, timed_out=True)) == 124
    assert exit_status(JobOutcome(0, {})) == 0 and exit_status(JobOutcome(5, {})) == 5


def test_death_watch_reports_deaths_in_the_order_they_happened() -> None:
    for order in ([2, 0, 1], [1, 2, 0]):
        procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
        watch = DeathWatch()
        try:
            for rank, proc in enumerate(procs):
                watch.watch(rank, proc.pid)
            for rank in order:  # each killed once the previous is dead, as mpiexec does
                procs[rank].kill()
                procs[rank].wait()
            assert watch.deaths() == [[rank] for rank in order]
            assert watch.deaths() == []
        finally:
            watch.close()
            for proc in procs:
                proc.kill()
                proc.wait()


def test_death_watch_of_a_process_already_gone() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    watch = DeathWatch()
    watch.watch(3, proc.pid)
    assert watch.deaths() == [[3]]
    watch.close()


def test_env_pairs_take_bare_names_from_the_environment() -> None:
    assert env_pairs(["A=1=2", "B"], {"B": "x"}) == [("A", "1=2"), ("B", "x")]
    with pytest.raises(LaunchError, match=r"-x C: C is not set in unisonrun's environment. Set it"):
        env_pairs(["C"], {})
    with pytest.raises(LaunchError, match="-x needs NAME or NAME=VALUE. Got '=v'"):
        env_pairs(["=v"], {})


def test_x_values_never_reach_the_mpiexec_command_line() -> None:
    hydra = MpiExec("mpiexec", "mpich", "5.0")
    assert hydra.command(2, ["p"], env_names=["KEY"]) == ["mpiexec", "-n", "2", "p"]
    narrowed = hydra.command(2, ["p"], env_names=["KEY"], extra=["-genvnone"])
    assert narrowed == ["mpiexec", "-n", "2", "-genvlist", "KEY", "p"]
    listed = hydra.command(2, ["p"], env_names=["KEY", "PATH"], extra=["-genvlist", "PATH"])
    assert listed == ["mpiexec", "-n", "2", "-genvlist", "PATH,KEY", "p"]
    ompi = MpiExec("mpirun", "openmpi", "4.1").command(2, ["p"], env_names=["KEY"])
    assert ompi == ["mpirun", "-n", "2", "-x", "KEY", "p"]
    assert name_flags("mpich", [], ["-genvnone"]) == ([], ["-genvnone"])


def test_programs_mpiexec_cannot_start_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(LaunchError, match=r"'train.py' is a file in this directory, but mpiexec looks up .* "
                                          r"unisonrun -np 2 python train.py --lr 1"):
        check_program(2, ["train.py", "--lr", "1"], path="/nonexistent")
    with pytest.raises(LaunchError, match=r"'\./train.py' is not executable \(mode 644\), so mpiexec cannot "
                                          r"start it\. Run it with the interpreter: unisonrun -np 4 python "
                                          r"\./train.py; or make it executable"):
        script.chmod(0o644)
        check_program(4, ["./train.py"])
    script.chmod(0o755)
    with pytest.raises(LaunchError, match=r"'\./train.py' has no '#!' first line, so it would run as a shell "
                                          r"script"):
        check_program(2, ["./train.py"])
    script.write_text("#!/usr/bin/env python\nprint('hi')\n")
    check_program(2, ["./train.py"])
    check_program(2, [str(script)])
    check_program(2, ["python", "train.py"])
    check_program(2, ["./not-here-maybe-on-other-hosts"])
    with pytest.raises(LaunchError, match="is a directory, not a program"):
        check_program(2, [os.fspath(tmp_path)])
