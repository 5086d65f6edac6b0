"""The launcher's closing report (`unison.launcher.supervision.reports`): one report per shared error."""

from __future__ import annotations

from unison._job.summary import Reason
from unison.launcher.supervision.reports import odd_first, report_lines
from unison.launcher.supervision.supervise import JobOutcome

MESSAGE = "MismatchError: Mismatched ALLREDUCE tensor shapes for 'allreduce.x': [2] on ranks [0, 2]; [3] on rank [1]."


def reason(rank: int, where: str) -> str:
    return f"rank {rank} (h, pid {10 + rank}) failed: {MESSAGE} at {where}"


def test_a_shared_error_is_one_report_with_the_odd_one_out_first() -> None:
    failures = {0: reason(0, "t.py:82 in main <- t.py:93 in <module>"), 2: reason(2, "t.py:82 in main"),
                1: reason(1, "t.py:81 in main")}
    assert report_lines(failures) == [
        f"unisonrun: ranks 1, 0 and 2 raised one {MESSAGE}",
        "unisonrun:   rank 1 (h, pid 11) at t.py:81 in main",
        "unisonrun:   rank 0 (h, pid 10) at t.py:82 in main <- t.py:93 in <module>",
        "unisonrun:   rank 2 (h, pid 12) at t.py:82 in main",
    ]


def test_between_two_ranks_the_earlier_call_of_one_function_comes_first_else_the_lower_rank() -> None:
    def r(rank: int, where: str) -> Reason:
        return Reason(rank, "h", rank, "MismatchError", "MismatchError: m", where)

    assert [x.rank for x in odd_first([r(0, "a.py:82 in main"), r(1, "a.py:81 in main")])] == [1, 0]
    assert [x.rank for x in odd_first([r(0, "a.py:90 in main"), r(1, "b.py:10 in step")])] == [0, 1]
    assert [x.rank for x in odd_first([r(1, "a.py:90 in main"), r(0, "")])] == [0, 1]


def test_other_failures_keep_their_line_and_order() -> None:
    failures = {1: "rank 1 (h, pid 11) failed: ValueError: x at t.py:3 in f", 0: reason(0, "t.py:82 in main"),
                3: "rank 3 (h, pid 13) ended without shutting unison down (killed by signal 9 (SIGKILL)) while the "
                   "job was running."}
    assert report_lines(failures) == [f"unisonrun: {why}" for why in failures.values()]


def test_the_outcome_summary_uses_it() -> None:
    outcome = JobOutcome(1, {0: reason(0, "t.py:82 in main"), 1: reason(1, "t.py:81 in main")})
    assert outcome.summary().splitlines()[0] == f"unisonrun: ranks 1 and 0 raised one {MESSAGE}"
