"""Tests of the stall inspector's decisions (unison.protocol.stall), with made-up clocks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unison.errors import ConfigError
from unison.protocol.places import Place
from unison.protocol.stall import StallInspector, StallReport, StallStatistics

Pending = Mapping[str, tuple[frozenset[int], frozenset[int]]]

CHECK = 60.0


def waiting_for(
    missing: set[int], submitted: set[int], *names: str
) -> dict[str, tuple[frozenset[int], frozenset[int]]]:
    expected = frozenset(missing | submitted)
    return {name: (frozenset(submitted), expected) for name in names}


ONE = waiting_for({1}, {0, 2}, "allreduce.grad/fc1.weight")


def test_no_report_before_check_seconds() -> None:
    inspector = StallInspector(CHECK, 600)
    for now in (0.0, 1.0, 30.0, 59.9):
        assert inspector.observe(now, ONE) is None
    assert inspector.statistics().warnings == 0


def test_report_when_a_tensor_has_waited_check_seconds() -> None:
    inspector = StallInspector(CHECK, 600)
    inspector.observe(0.0, ONE)
    report = inspector.observe(60.0, ONE)
    assert isinstance(report, StallReport)
    assert report.waiting == (("allreduce.grad/fc1.weight", (0, 2), (1,), 60.0),)
    assert not report.shutdown
    assert report.text.splitlines() == [
        (
            "Stall: 1 tensor has waited more than 60 s for ranks that have not submitted it (this "
            "may mean ranks run different code paths or one rank is stuck):"
        ),
        "  rank 1 has not submitted: allreduce.grad/fc1.weight (waiting 60.0 s, submitted by ranks [0, 2])",
        "The job will stop if this lasts 600 s (UNISON_STALL_SHUTDOWN_TIME_SECONDS); 0 disables.",
    ]
    assert inspector.statistics().warnings == 1


def test_pending_time_counts_from_the_first_observation() -> None:
    inspector = StallInspector(CHECK, 0)
    assert inspector.observe(1000.0, {}) is None
    assert inspector.observe(1010.0, ONE) is None  # first seen now, not at 1000
    assert inspector.observe(1069.0, ONE) is None
    assert inspector.observe(1070.0, ONE) is not None


def test_warnings_back_off_exponentially() -> None:
    inspector = StallInspector(CHECK, 0)
    reported = [now for now in range(1000) if inspector.observe(float(now), ONE) is not None]
    # check, then +2*check, +4*check, +8*check after the previous warning.
    assert reported == [60, 180, 420, 900]
    assert inspector.statistics().warnings == 4


def test_no_second_report_before_the_backoff_and_one_at_three_times_check() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    assert inspector.observe(CHECK, ONE) is not None
    assert inspector.observe(CHECK + 1, ONE) is None
    assert inspector.observe(3 * CHECK - 0.5, ONE) is None
    assert inspector.observe(3 * CHECK, ONE) is not None


def test_late_observations_stretch_the_backoff() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    assert inspector.observe(60.0, ONE) is not None
    assert inspector.observe(300.0, ONE) is not None  # due at 180, observed late: gap 240
    assert inspector.observe(779.0, ONE) is None  # next gap is at least 480
    assert inspector.observe(780.0, ONE) is not None


def test_completed_tensors_are_forgotten() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    assert inspector.observe(30.0, {}) is None  # it completed
    assert inspector.statistics().tensors_tracked == 0
    assert inspector.observe(40.0, ONE) is None  # a new stall under the same name starts now
    assert inspector.observe(99.0, ONE) is None
    report = inspector.observe(100.0, ONE)
    assert report is not None and report.waiting[0][3] == 60.0


def test_a_new_stall_after_a_resolved_one_is_reported_after_check_seconds() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    assert inspector.observe(60.0, ONE) is not None
    assert inspector.observe(70.0, {}) is None  # resolved: the backoff starts over
    other = waiting_for({3}, {0, 1, 2}, "allreduce.other")
    inspector.observe(80.0, other)
    assert inspector.observe(139.0, other) is None
    report = inspector.observe(140.0, other)
    assert report is not None and [w[0] for w in report.waiting] == ["allreduce.other"]


def test_young_tensors_are_not_reported_with_old_ones() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    young = {**ONE, **waiting_for({1}, {0}, "allreduce.young")}
    report = inspector.observe(60.0, young)
    assert report is not None and [w[0] for w in report.waiting] == ["allreduce.grad/fc1.weight"]
    assert inspector.statistics().tensors_tracked == 2
    assert inspector.statistics().tensors_stalled == 1


def test_report_groups_names_by_missing_rank_and_caps_them() -> None:
    inspector = StallInspector(CHECK, 0, max_names_per_rank=3)
    names = [f"allreduce.t{i:02d}" for i in range(10)]
    first = waiting_for({1, 3}, {0, 2}, *names[:5])
    inspector.observe(0.0, first)
    pending = {**first, **waiting_for({3}, {0, 1, 2}, *names[5:])}
    report = inspector.observe(60.0, pending)
    assert report is not None
    lines = report.text.splitlines()
    assert lines[0].startswith("Stall: 5 tensors have waited more than 60 s")
    assert lines[1] == (
        "  rank 1 has not submitted: allreduce.t00 (waiting 60.0 s, submitted by ranks [0, 2]), "
        "allreduce.t01, allreduce.t02, ... and 2 more"
    )
    assert lines[2] == (
        "  rank 3 has not submitted: allreduce.t00 (waiting 60.0 s, submitted by ranks [0, 2]), "
        "allreduce.t01, allreduce.t02, ... and 2 more"
    )
    assert len(lines) == 4 and "0 disables" not in lines[3] and "will not be stopped" in lines[3]
    # The younger tensors become stalled later; rank 3 then has all 10 names.
    report = inspector.observe(180.0, pending)
    assert report is not None
    assert "  rank 3 has not submitted: allreduce.t00 (waiting 180.0 s" in report.text
    assert "... and 7 more" in report.text


def test_longest_waiting_first_and_ranks_sorted() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, waiting_for({5, 3}, {4, 0, 2}, "allreduce.old"))
    pending = {
        **waiting_for({5, 3}, {4, 0, 2}, "allreduce.old"),
        **waiting_for({7, 1}, {6, 0}, "allreduce.new"),
    }
    inspector.observe(10.0, pending)
    report = inspector.observe(75.0, pending)
    assert report is not None
    assert report.waiting == (
        ("allreduce.old", (0, 2, 4), (3, 5), 75.0),
        ("allreduce.new", (0, 6), (1, 7), 65.0),
    )
    ranks = [int(line.split()[1]) for line in report.text.splitlines() if line.startswith("  rank ")]
    assert ranks == [1, 3, 5, 7]
    assert "submitted by ranks [0, 2, 4])" in report.text


def test_consecutive_ranks_are_shown_as_ranges() -> None:
    inspector = StallInspector(CHECK, 0)
    pending = waiting_for({12}, set(range(12)) - {5}, "allreduce.x")
    inspector.observe(0.0, pending)
    report = inspector.observe(60.0, pending)
    assert report is not None and "submitted by ranks [0-4, 6-11])" in report.text


def test_shutdown_is_reported_at_once_regardless_of_backoff() -> None:
    inspector = StallInspector(CHECK, 120)
    pending = {**ONE, **waiting_for({2}, {0, 1}, "allreduce.later")}
    inspector.observe(0.0, ONE)
    assert inspector.observe(60.0, ONE) is not None  # warning; next one not before 180
    inspector.observe(61.0, pending)
    report = inspector.observe(120.0, pending)
    assert report is not None and report.shutdown
    assert report.text.splitlines()[-1] == (
        "Stopping the job: rank(s) [1] stalled for more than 120 s (UNISON_STALL_SHUTDOWN_TIME_SECONDS)."
    )
    assert "  rank 2 has not submitted: allreduce.later (waiting 59.0 s" not in report.text  # too young
    again = inspector.observe(121.0, pending)
    assert again is not None and again.shutdown  # every observation while it holds
    assert inspector.statistics().shutdown_reports == 2
    assert inspector.statistics().warnings == 1


def test_shutdown_names_every_rank_past_the_limit() -> None:
    inspector = StallInspector(CHECK, 60)
    pending = {**waiting_for({3}, {0}, "a"), **waiting_for({1}, {0}, "b")}
    inspector.observe(0.0, pending)
    report = inspector.observe(60.0, pending)
    assert report is not None and report.shutdown
    assert "rank(s) [1, 3] stalled for more than 60 s" in report.text


def test_no_shutdown_when_disabled() -> None:
    inspector = StallInspector(CHECK, 0)
    inspector.observe(0.0, ONE)
    reports = [inspector.observe(float(now), ONE) for now in range(60, 100_000, 60)]
    assert not any(r.shutdown for r in reports if r is not None)
    assert "will not be stopped (UNISON_STALL_SHUTDOWN_TIME_SECONDS=0)" in str(
        next(r for r in reports if r is not None).text
    )


def test_fully_submitted_entries_are_not_reported() -> None:
    inspector = StallInspector(CHECK, 0)
    done = {"allreduce.done": (frozenset({0, 1}), frozenset({0, 1}))}
    inspector.observe(0.0, done)
    assert inspector.observe(100.0, done) is None


def test_statistics_and_repr() -> None:
    inspector = StallInspector(CHECK, 600)
    inspector.observe(0.0, ONE)
    inspector.observe(75.5, ONE)
    assert inspector.statistics() == StallStatistics(
        observations=2, warnings=1, shutdown_reports=0, tensors_tracked=1, tensors_stalled=1,
        longest_pending_seconds=75.5,
    )
    assert repr(inspector) == (
        "<StallInspector check_seconds=60 shutdown_seconds=600 tracked=1 stalled=1 warnings=1>"
    )


@pytest.mark.parametrize(
    ("check", "shutdown", "match"),
    [
        (0, 600, r"positive number of seconds .*Got check_seconds=0\."),
        (-1.0, 600, r"Got check_seconds=-1.0\."),
        (math.nan, 600, r"Got check_seconds=nan\."),
        (60, 30, r"0 \(never stop\) or at least .*Got shutdown_seconds=30 with check_seconds=60\."),
        (60, -5, r"Got shutdown_seconds=-5 with check_seconds=60\."),
    ],
)
def test_bad_settings_raise_config_error(check: float, shutdown: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StallInspector(check, shutdown)


def test_bad_name_cap_raises_config_error() -> None:
    message = r"max_names_per_rank must be an integer >= 1\. Got max_names_per_rank=0\."
    with pytest.raises(ConfigError, match=message):
        StallInspector(max_names_per_rank=0)


def test_shutdown_equal_to_check_is_allowed() -> None:
    assert StallInspector(5, 5).shutdown_seconds == 5


# ------------------------------------------------------------------------------------- properties

NAMES = [f"allreduce.t{i}" for i in range(6)]
RANKS = range(4)

entry = st.tuples(
    st.frozensets(st.sampled_from(RANKS), min_size=1),
    st.frozensets(st.sampled_from(RANKS), min_size=1),
).map(lambda pair: (pair[0], pair[0] | pair[1]))  # submitted is always a subset of expected
pending_maps = st.dictionaries(st.sampled_from(NAMES), entry, max_size=len(NAMES))
steps = st.lists(st.tuples(st.floats(0, 200), pending_maps), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps=steps, check=st.sampled_from([1.0, 10.0, 60.0]), shutdown_factor=st.sampled_from([0, 1, 3]))
def test_reports_only_name_currently_pending_tensors(
    steps: list[tuple[float, Pending]], check: float, shutdown_factor: int
) -> None:
    inspector = StallInspector(check, check * shutdown_factor)
    now = 0.0
    first_seen: dict[str, float] = {}
    for delta, pending in steps:
        now += delta
        first_seen = {name: first_seen.get(name, now) for name in pending}
        report = inspector.observe(now, pending)
        if report is None:
            continue
        assert report.waiting
        for name, submitted, missing, seconds in report.waiting:
            assert name in pending
            assert set(submitted) == pending[name][0]
            assert set(missing) == pending[name][1] - pending[name][0] and missing
            assert list(submitted) == sorted(submitted) and list(missing) == sorted(missing)
            assert seconds == now - first_seen[name] >= check
            assert f"  rank {missing[0]} has not submitted: " in report.text
        assert [w[3] for w in report.waiting] == sorted((w[3] for w in report.waiting), reverse=True)
        longest = report.waiting[0][3]
        assert report.shutdown == (shutdown_factor > 0 and longest >= check * shutdown_factor)


stuck_steps = st.lists(st.tuples(st.floats(0.01, 100), pending_maps), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps=stuck_steps, check=st.sampled_from([1.0, 10.0]))
def test_warnings_never_get_more_frequent_while_a_tensor_stays_stuck(
    steps: list[tuple[float, Pending]], check: float
) -> None:
    inspector = StallInspector(check, 0)
    stuck = {"allreduce.stuck": (frozenset({0}), frozenset({0, 1}))}
    now = 0.0
    warnings: list[float] = []
    for delta, others in steps:
        now += delta
        if inspector.observe(now, {**others, **stuck}) is not None:
            warnings.append(now)
    assert not warnings or warnings[0] >= check
    gaps = [b - a for a, b in itertools.pairwise(warnings)]
    if gaps:
        assert gaps[0] >= 2 * check
    for earlier, later in itertools.pairwise(gaps):
        assert later >= 2 * earlier


# -- deadlock: every rank a pending tensor waits for is itself blocked ----------------------------

_METRIC = {"allreduce.noname.0": (frozenset({0}), frozenset({0, 1}))}
_GRADS = {f"allreduce.grad.{i}": (frozenset({1}), frozenset({0, 1})) for i in range(3)}


def test_a_deadlock_is_reported_once_it_held_for_the_deadlock_time() -> None:
    inspector = StallInspector(60, 600, deadlock_seconds=2)
    pending = {**_METRIC, **_GRADS}
    assert inspector.observe(0.0, pending, frozenset({0, 1})) is None
    assert inspector.observe(1.0, pending, frozenset({0, 1})) is None
    report = inspector.observe(2.0, pending, frozenset({0, 1}))
    assert report is not None and report.shutdown and report.deadlock
    assert report.text.startswith("Deadlock: ")
    assert "  rank 0 waits for allreduce.noname.0 (unnamed allreduce #0); has not submitted " \
           "allreduce.grad.0, allreduce.grad.1, allreduce.grad.2\n" in report.text
    assert "  rank 1 waits for allreduce.grad.0, allreduce.grad.1, allreduce.grad.2; has not submitted " \
           "allreduce.noname.0 (unnamed allreduce #0)\n" in report.text
    assert "they stayed so for 2 s (UNISON_DEADLOCK_SECONDS; 0 turns this check off)" in report.text
    assert {w[0] for w in report.waiting} == set(pending)
    assert inspector.statistics().shutdown_reports == 1


@pytest.mark.parametrize("blocked", [frozenset(), frozenset({0}), frozenset({1})])
def test_no_deadlock_while_a_missing_rank_can_still_submit(blocked: frozenset[int]) -> None:
    # rank 1 is missing from the metric; unless it is blocked it may still submit it (and vice versa).
    inspector = StallInspector(60, 600, deadlock_seconds=1)
    pending = {**_METRIC, **_GRADS}
    reports = [inspector.observe(float(now), pending, blocked) for now in range(0, 120, 1)]
    assert not any(report.deadlock for report in reports if report is not None)
    assert reports[60] is not None and reports[60].text.startswith("Stall: ")  # the ordinary warning


def test_a_blocked_state_that_changes_starts_the_deadlock_window_again() -> None:
    inspector = StallInspector(60, 600, deadlock_seconds=2)
    both = frozenset({0, 1})
    assert inspector.observe(0.0, {**_METRIC, **_GRADS}, both) is None
    assert inspector.observe(1.5, _METRIC | {"allreduce.grad.0": _GRADS["allreduce.grad.0"]}, both) is None
    assert inspector.observe(3.0, _METRIC | {"allreduce.grad.0": _GRADS["allreduce.grad.0"]}, both) is None
    assert inspector.observe(3.5, _METRIC | {"allreduce.grad.0": _GRADS["allreduce.grad.0"]}, both).deadlock


def test_missing_ranks_that_finish_call_after_call_while_blocked_are_no_deadlock() -> None:
    # Ranks 0 and 1 loop collectives of their own (a process set, or beside an asynchronous call rank 2
    # waits for): every look finds their main threads blocked, each time in a new wait.
    inspector = StallInspector(60, 600, deadlock_seconds=2)
    pending = {"allreduce.all": (frozenset({2}), frozenset({0, 1, 2}))}
    blocked = frozenset({0, 1, 2})
    for now in range(10):
        places = {rank: Place("t.py:9 in main", "allreduce.pair", wait_number=100 * now + rank) for rank in (0, 1)}
        places[2] = Place("t.py:12 in main", "allreduce.all", wait_number=7)
        assert inspector.observe(float(now), pending, blocked, places) is None
    # Once their main threads stay in one wait (the same numbers), the window runs: a deadlock.
    still = {0: Place("t.py:9 in main", "allreduce.x", wait_number=5), 1: Place("t.py:9 in main", wait_number=6),
             2: Place("t.py:12 in main", "allreduce.all", wait_number=7)}
    assert inspector.observe(10.0, pending, blocked, still) is None
    assert inspector.observe(11.0, pending, blocked, still) is None
    report = inspector.observe(12.0, pending, blocked, still)
    assert report is not None and report.deadlock


def test_a_rank_not_missing_from_any_collective_may_progress_during_a_deadlock() -> None:
    # Rank 2 loops collectives in a set of its own; ranks 0 and 1 wait for each other for good.
    inspector = StallInspector(60, 600, deadlock_seconds=2)
    pending = {**_METRIC, **_GRADS}
    reports = [inspector.observe(float(now), pending, frozenset({0, 1, 2}),
                                 {0: Place("t.py:1 in f", wait_number=1), 1: Place("t.py:2 in f", wait_number=1),
                                  2: Place("t.py:3 in f", wait_number=now)}) for now in range(3)]
    assert reports[2] is not None and reports[2].deadlock


def test_the_deadlock_check_is_off_at_zero_and_refuses_bad_values() -> None:
    inspector = StallInspector(60, 600, deadlock_seconds=0)
    for now in range(10):
        assert inspector.observe(float(now), _METRIC, frozenset({0, 1})) is None
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="UNISON_DEADLOCK_SECONDS"):
            StallInspector(60, 600, deadlock_seconds=bad)


def test_a_joined_or_complete_rank_set_is_no_deadlock() -> None:
    # Nothing is missing (the tensor is about to run): blocked ranks waiting on it are no deadlock.
    inspector = StallInspector(60, 600, deadlock_seconds=1)
    ready = {"allreduce.x": (frozenset({0, 1}), frozenset({0, 1}))}
    for now in range(5):
        assert inspector.observe(float(now), ready, frozenset({0, 1})) is None
