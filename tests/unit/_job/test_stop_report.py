"""What a rank prints when an error ends it (`unison._job.stop_report`) and the summary line read back."""

from __future__ import annotations

import traceback

import pytest

from unison._job import stop_report
from unison._job.stop_report import Role, decide, role_of, shared_error, stop_words
from unison._job.summary import describe, parse_reason, without_unison_frames
from unison._job.torch_error_file import after_the_cause
from unison.errors import AbortedError, JobInterrupt, MismatchError, ShutdownError, StallError

WHO = "rank 2 (h, pid 7)"
PEERS_GONE = ("unison has been shut down: rank(s) [0, 1] called shutdown() (or exited) while this rank still had "
              "collectives pending. A rank that finishes early, or fails, stops the job for everyone.")


def said(role: Role, rank: int = 2, *, launcher: bool = False, reason: str = "", aborted: str = "",
         logged: bool = False, error: str = "AbortedError") -> stop_report.Said:
    return decide(role, rank=rank, who=f"rank {rank} (h, pid 7)", where="t.py:8 in main", error=error, reason=reason,
                  under_launcher=launcher, aborted_reason=aborted, logged=logged)


def test_each_error_has_its_role() -> None:
    assert role_of(ValueError("x")) is Role.OWN and role_of(ShutdownError("x")) is Role.OWN
    assert role_of(MismatchError("x")) is Role.SHARED
    chained = RuntimeError("callback failed")
    chained.__cause__ = MismatchError("x")
    assert role_of(chained) is Role.SHARED
    # DDP: torch's autograd re-raises the hook's error as text only, with no cause attached.
    assert role_of(RuntimeError("Got the following error when running the callback: MismatchError: x")) is Role.SHARED
    assert role_of(RuntimeError("Got the following error when running the callback: ValueError: x")) is Role.OWN
    assert shared_error(RuntimeError("Got the following error when running the callback: MismatchError: x")) == (
        "MismatchError")
    for error in (AbortedError("x"), StallError("x"), JobInterrupt("x")):
        assert role_of(error) is Role.CONSEQUENCE
    # a peer's shutdown (or exit) stopped this rank's pending collectives: its end is the peer's doing
    assert role_of(ShutdownError(PEERS_GONE)) is Role.CONSEQUENCE
    assert role_of(ShutdownError("unison has been shut down; no more collectives can run.")) is Role.OWN


def test_a_ranks_own_error_prints_its_traceback_and_its_line_only_without_the_launcher() -> None:
    assert said(Role.OWN, launcher=True, aborted="rank 2 (h, pid 7) failed: ValueError: x") == stop_report.Said(True, "")
    assert said(Role.OWN, aborted="rank 2 (h, pid 7) failed: ValueError: x").line == (
        "unison: rank 2 (h, pid 7) failed: ValueError: x; stopping every rank.")


def test_a_shared_error_is_reported_by_the_launcher_or_rank_0_and_pointed_to_by_the_others() -> None:
    assert said(Role.SHARED, launcher=True, error="MismatchError") == stop_report.Said(
        False, f"unison: {WHO} stopped at t.py:8 in main: MismatchError, raised on every rank of the collective; "
               "unisonrun reports it.")
    zero = said(Role.SHARED, rank=0, error="MismatchError")
    assert zero.traceback and zero.line.endswith("; stopping every rank.")
    assert said(Role.SHARED, error="MismatchError").line.endswith("; rank 0 reports it.")


@pytest.mark.parametrize(("reason", "words", "reporter"), [
    ("rank 1 (h, pid 9) failed: ValueError: bad at t.py:3 in f", "rank 1 (h, pid 9) failed (ValueError)", 1),
    ("rank 1 (h, pid 9) failed: MismatchError: m at t.py:3 in f", "rank 1 (h, pid 9) failed (MismatchError)", None),
    ("Deadlock: every rank ...\n  rank 0 waits for x", "the job deadlocked", None),
    ("Stall: 1 tensor has waited more than 2 s for ranks ... stuck):\n  rank 1 has not submitted: x", "the job stalled",
     None),
    (PEERS_GONE, "rank(s) [0, 1] shut unison down (or exited) while this rank had collectives pending", 2),
    ("rank 1 stopped answering: rank 0 waited 10 s", "rank 1 stopped answering: rank 0 waited 10 s", None),
])
def test_a_stop_in_few_words_and_who_reports_it(reason: str, words: str, reporter: int | None) -> None:
    assert stop_words(reason) == (words, reporter)


def test_a_stopped_rank_prints_one_line_and_rank_0_the_full_reason_when_it_reports() -> None:
    lost = "rank 1 stopped answering: rank 0 waited 10 s\nfor rank 1"
    assert said(Role.CONSEQUENCE, reason=lost, launcher=True).line == (
        f"unison: {WHO} stopped at t.py:8 in main: AbortedError: rank 1 stopped answering: rank 0 waited 10 s; "
        "unisonrun reports it.")
    assert said(Role.CONSEQUENCE, rank=0, reason=lost).line == (
        "unison: rank 0 (h, pid 7) stopped at t.py:8 in main: AbortedError: rank 1 stopped answering: rank 0 waited "
        "10 s for rank 1")
    assert said(Role.CONSEQUENCE, reason=lost).line.endswith(": rank 1 stopped answering: rank 0 waited 10 s; rank 0 "
                                                              "reports it.")
    own = "rank 1 (h, pid 9) failed: ValueError: bad at t.py:3 in f"
    assert said(Role.CONSEQUENCE, rank=0, reason=own).line.endswith("failed (ValueError); rank 1 reports it.")
    # A stall's report is rank 0's log already: rank 0 says so in one line too.
    stall = said(Role.CONSEQUENCE, rank=0, reason="Deadlock: x\n  rank 0 waits", logged=True, error="StallError")
    assert stall == stop_report.Said(False, "unison: rank 0 (h, pid 7) stopped at t.py:8 in main: StallError: the job "
                                            "deadlocked; rank 0 reports it.")


def test_the_lowest_rank_a_peer_s_shutdown_stopped_reports_it_in_full() -> None:
    # ranks 0 and 1 exited; ranks 2 and 3 raised ShutdownError: rank 2 says why, rank 3 points to it
    full = said(Role.CONSEQUENCE, rank=2, reason=PEERS_GONE, error="ShutdownError")
    assert full == stop_report.Said(False, f"unison: {WHO} stopped at t.py:8 in main: ShutdownError: {PEERS_GONE} "
                                           "With uneven data, a rank that runs out of data first must call hvd.join() "
                                           "instead of finishing.")
    # A reason that names the fix already does not get it twice.
    told = f"{PEERS_GONE} Call hvd.join() on a rank that runs out of data."
    assert said(Role.CONSEQUENCE, rank=2, reason=told, error="ShutdownError").line.endswith(f"ShutdownError: {told}")
    assert said(Role.CONSEQUENCE, rank=3, reason=PEERS_GONE, error="ShutdownError").line.endswith(
        "ShutdownError: rank(s) [0, 1] shut unison down (or exited) while this rank had collectives pending; rank 2 "
        "reports it.")
    assert said(Role.CONSEQUENCE, rank=2, reason=PEERS_GONE, error="ShutdownError", launcher=True).line.endswith(
        "while this rank had collectives pending; unisonrun reports it.")


@pytest.mark.parametrize(("sites", "order"), [
    ({0: "a.py:82 in main <- a.py:96 in <module>", 1: "a.py:81 in main <- a.py:96 in <module> (DDP bucket 0)"}, [1, 0]),
    ({0: "a.py:5 in f", 1: "a.py:9 in f", 2: "a.py:5 in f"}, [1, 0, 2]),  # the one site the fewest share
    ({0: "a.py:9 in f", 1: "b.py:5 in g"}, [0, 1]),  # two functions: the line says nothing, the rank decides
    ({0: "", 1: "a.py:5 in f"}, [0, 1]),  # a rank without a site
])
def test_the_odd_one_out_comes_first(sites: dict[int, str], order: list[int]) -> None:
    assert stop_report.odd_order(sites) == order


def test_under_torchrun_the_odd_one_out_of_a_mismatch_and_rank_0_of_a_stall_come_first() -> None:
    message = "Mismatched x. Every rank... Called at t.py:5 in main on ranks [0, 2]; t.py:4 in main on rank [1]."
    assert [after_the_cause(Role.SHARED, rank, message, False) for rank in range(3)] == [True, False, True]
    assert [after_the_cause(Role.CONSEQUENCE, rank, "Stall: ...", True) for rank in range(2)] == [False, True]
    assert [after_the_cause(Role.CONSEQUENCE, rank, PEERS_GONE, False) for rank in (2, 3)] == [True, True]
    assert not after_the_cause(Role.OWN, 1, "ValueError: x", False)


def _raised() -> BaseException:
    try:  # a frame of this file, then unison's
        describe(None, 0, "h", 1)  # type: ignore[arg-type]
    except AttributeError as exc:
        return exc
    raise AssertionError("describe(None) did not raise")


def test_the_summary_line_reads_back() -> None:
    error = _raised()
    line = describe(error, 3, "node 7", 42)
    parsed = parse_reason(line)
    assert parsed is not None and (parsed.rank, parsed.host, parsed.pid, parsed.error) == (3, "node 7", 42,
                                                                                           "AttributeError")
    assert parsed.where.startswith("test_stop_report.py:") and parsed.message.startswith("AttributeError: ")
    assert parsed.who == "rank 3 (node 7, pid 42)"
    framed = parse_reason("rank 1 (h, pid 2) failed: ValueError: x at 3 places")  # no frames: the 'at' is the message's
    assert framed is not None and framed.where == "" and framed.message == "ValueError: x at 3 places"
    assert parse_reason("the job deadlocked (found by rank 0, h, pid 1): ...") is None
    wrapped = parse_reason("rank 0 (h, pid 2) failed: RuntimeError: Got the following error when running the "
                           "callback: MismatchError: shapes differ. at t.py:37 in <module>")
    assert wrapped is not None and (wrapped.error, wrapped.message, wrapped.where) == (
        "MismatchError", "MismatchError: shapes differ.", "t.py:37 in <module>")
    assert parse_reason("rank 1 (h, pid 2) failed: ValueError: " + "x" * 600 + "...") is None  # cut short


def test_tracebacks_leave_out_unisons_frames() -> None:
    error = _raised()
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    assert any("/unison/" in f for f in files) and any(f.endswith("test_stop_report.py") for f in files)
    kept = [frame.filename for frame in traceback.extract_tb(without_unison_frames(error.__traceback__))]
    assert kept == [f for f in files if "/unison/" not in f]
    assert without_unison_frames(None) is None
    inner = error.__traceback__
    while inner is not None and inner.tb_next is not None:
        inner = inner.tb_next
    assert without_unison_frames(inner) is inner  # unison's frames only: kept, rather than none
