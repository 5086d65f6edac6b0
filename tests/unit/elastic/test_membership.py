"""The elastic driver's decisions on hand-written sequences of discovery results and epoch endings."""

from __future__ import annotations

import math
import random

import pytest

from unison.elastic.membership import (
    Ending,
    Epoch,
    Host,
    Limits,
    Membership,
    Stop,
    Wait,
    blame_hosts,
    cooldown_seconds,
    error_of,
    parse_discovery,
)
from unison.errors import LaunchError

A, B, C = Host("a", 2), Host("b", 2), Host("c", 1)


def test_parse_discovery_lines_and_errors() -> None:
    assert parse_discovery("a:2\n\n# comment\nb:1  # trailing\na:5\nz:0\n") == (Host("a", 2), Host("b", 1))
    assert parse_discovery("a\n", default_slots=3) == (Host("a", 3),)
    with pytest.raises(LaunchError, match=r"'a' \(line 1\) without slots. Print 'host:slots' or pass --slots-per-host"):
        parse_discovery("a\n")
    with pytest.raises(LaunchError, match=r"printed 'a:x' \(line 2\); each line must be 'host:slots'"):
        parse_discovery("b:1\na:x\n")


def test_limits_are_checked() -> None:
    with pytest.raises(LaunchError, match=r"--max-np must be at least --min-np. Got --min-np 3 --max-np 2"):
        Limits(3, 2)
    with pytest.raises(LaunchError, match="--blacklist-cooldown-range A B needs 0 <= A <= B"):
        Limits(1, cooldown_range=(5.0, 1.0))


def test_grow_to_max_np_keeping_running_hosts_first() -> None:
    m = Membership(Limits(min_np=2, max_np=4))
    first = m.plan((B, A), now=0)
    assert first == Epoch(0, (B, A))
    m.started(first)
    assert not m.wants_change((B, A), now=0)
    # Discovery reorders and adds a host: running hosts keep their places, the cap holds.
    assert not m.wants_change((C, A, B), now=1)
    assert m.ended(Ending.HOSTS_UPDATED, now=1) is None
    m2 = Membership(Limits(min_np=2, max_np=5))
    m2.started(Epoch(0, (A,)))
    assert m2.wants_change((C, A), now=1)
    assert m2.plan((C, A), now=1) == Epoch(1, (A, C))


def test_removal_then_wait_then_timeout_message() -> None:
    m = Membership(Limits(min_np=3))
    m.started(m.plan((A, C), now=0))  # type: ignore[arg-type]
    assert m.wants_change((A,), now=1)  # c left discovery
    assert m.ended(Ending.HOSTS_UPDATED, now=1) is None
    waiting = m.plan((A,), now=2)
    assert waiting == Wait(2, 3, "2 ranks available, 3 needed (--min-np 3); discovered: a:2")


def test_failed_host_blacklisted_for_good_and_every_host_blacklisted_stops() -> None:
    m = Membership(Limits(min_np=1))
    m.started(m.plan((A, B), now=0))  # type: ignore[arg-type]
    assert m.ended(Ending.FAILED, failed_hosts=("a",), now=1) is None
    assert m.plan((A, B), now=1e9) == Epoch(1, (B,))
    m.started(Epoch(1, (B,)))
    assert m.ended(Ending.FAILED, failed_hosts=("b",), now=2) is None
    decision = m.plan((A, B), now=3)
    assert isinstance(decision, Stop)
    assert "every host the discovery script offers is blacklisted after failing (a:2, b:2)" in decision.message


def test_cooldown_returns_a_host_after_its_draw() -> None:
    m = Membership(Limits(min_np=1, cooldown_range=(10.0, 20.0)), rng=random.Random(1))
    m.started(m.plan((A, B), now=0))  # type: ignore[arg-type]
    m.ended(Ending.FAILED, failed_hosts=("a",), now=100)
    until = m.blacklist["a"]
    assert 110 <= until <= 120
    assert m.plan((A, B), now=until - 0.1) == Epoch(1, (B,))
    m.started(Epoch(1, (B,)))
    assert m.wants_change((A, B), now=until)  # a is back: grow
    assert m.plan((A, B), now=until) == Epoch(2, (B, A))
    # All blacklisted but with a cooldown: wait, not stop.
    m.ended(Ending.FAILED, failed_hosts=("a", "b"), now=until)
    assert isinstance(m.plan((A, B), now=until + 1), Wait)


def test_a_host_that_fails_again_stays_out_longer_each_time_up_to_the_range_end() -> None:
    # Horovod's backoff: the n-th failure of a host keeps it out A * 2**n plus up to A of jitter, at most B.
    m = Membership(Limits(min_np=1, cooldown_range=(1.0, 20.0)), rng=random.Random(3))
    m.started(m.plan((A, B), now=0))  # type: ignore[arg-type]
    cooldowns = []
    now = 0.0
    for _ in range(6):
        m.ended(Ending.FAILED, failed_hosts=("a",), now=now)
        cooldowns.append(m.blacklist["a"] - now)
        now = m.blacklist["a"]
    for n, cooldown in enumerate(cooldowns[:4], 1):
        assert 2 ** n <= cooldown < 2 ** n + 1, (n, cooldowns)
    assert cooldowns[4:] == [20.0, 20.0] and m.blacklistings == {"a": 6}
    assert m.blacklist.get("b") is None
    assert [cooldown_seconds(4.0, 5.0, 1, 0.9), cooldown_seconds(0.0, 0.0, 3, 0.5)] == [5.0, 0.0]


@pytest.mark.parametrize("ending", [Ending.FAILED, Ending.HOSTS_UPDATED])
def test_reset_limit(ending: Ending) -> None:
    m = Membership(Limits(min_np=1, reset_limit=2, cooldown_range=(0.0, 0.0)))
    m.started(m.plan((A,), now=0))  # type: ignore[arg-type]
    assert m.ended(ending, now=1) is None
    assert m.ended(ending, now=2) is None
    stop = m.ended(ending, now=3)
    assert isinstance(stop, Stop) and "needs reset 3" in stop.message and "--reset-limit is 2" in stop.message
    assert m.ended(Ending.FINISHED) is None
    assert m.statistics()["resets"] == 3


def test_epoch_maps_ranks_to_hosts() -> None:
    epoch = Epoch(4, (A, C, B))
    assert epoch.np == 5 and epoch.hosts_argument() == "a:2,c:1,b:2"
    assert [epoch.host_of(r) for r in range(5)] == ["a", "a", "c", "b", "b"]
    with pytest.raises(ValueError, match="beyond this epoch's 5 ranks"):
        epoch.host_of(5)


def test_blame_hosts_names_failed_ranks_hosts_and_unreachable_hosts_in_epoch_order() -> None:
    epoch = Epoch(0, (A, C, B))  # ranks: a 0-1, c 2, b 3-4
    assert blame_hosts(epoch, [], {}) == {}
    assert blame_hosts(epoch, [4, 3, 0], {}) == {"a": "rank 0 failed", "b": "ranks 3, 4 failed"}
    # A launch onto a vanished host fails in mpiexec before any rank starts: no rank is named.
    assert blame_hosts(epoch, [], {"c": "exit status 255"}) == {"c": "unreachable: exit status 255"}
    assert blame_hosts(epoch, [2, 7, -1], {"c": "timed out", "z": "not in this epoch"}) == {
        "c": "rank 2 failed; unreachable: timed out"}


def test_an_unreachable_host_is_blacklisted_so_relaunches_do_not_burn_the_reset_limit() -> None:
    m = Membership(Limits(min_np=2, reset_limit=1))
    first = m.plan((A, C, B), now=0)
    assert isinstance(first, Epoch)
    m.started(first)
    blamed = blame_hosts(first, [], {"c": "exit status 255"})
    assert m.ended(Ending.FAILED, blamed, now=1) is None
    assert m.blacklisted(now=2) == {"c": (math.inf, "unreachable: exit status 255")}
    second = m.plan((A, C, B), now=2)
    assert second == Epoch(1, (A, B))
    m.started(second)  # type: ignore[arg-type]
    assert not m.wants_change((A, C, B), now=1e9)  # still listed, still left out: no more resets
    assert m.ended(Ending.FINISHED) is None and m.resets == 1


def test_blacklisted_reports_time_left_and_forgets_expired_cooldowns() -> None:
    m = Membership(Limits(min_np=1, cooldown_range=(5.0, 5.0)))
    m.started(Epoch(0, (A, B)))
    m.ended(Ending.FAILED, {"a": "rank 0 failed"}, now=10)
    m.ended(Ending.FAILED, ("b",), now=12)
    assert m.blacklisted(now=13) == {"a": (2.0, "rank 0 failed"), "b": (4.0, "failed")}
    assert m.blacklisted(now=15) == {"b": (2.0, "failed")}
    assert m.blacklisted(now=17) == {}
    assert m.plan((A, B), now=17) == Epoch(1, (A, B))


def test_launches_failing_before_their_first_commit_stop_the_job_after_three_in_a_row() -> None:
    m = Membership(Limits(min_np=1, cooldown_range=(0.0, 0.0)))
    m.started(m.plan((A,), now=0))  # type: ignore[arg-type]
    assert m.ended(Ending.FAILED, now=1, committed=False) is None
    assert m.ended(Ending.FAILED, now=2, committed=False) is None
    assert m.ended(Ending.FAILED, now=3, committed=True) is None  # it made progress: count again
    assert m.ended(Ending.FAILED, now=4, committed=False) is None
    assert m.ended(Ending.HOSTS_UPDATED, now=5, committed=False) is None  # not a failure
    assert m.ended(Ending.FAILED, now=6, committed=False) is None
    assert m.ended(Ending.FAILED, now=7, committed=False) is None
    stop = m.ended(Ending.FAILED, failed_hosts=("a",), now=8, committed=False)
    assert isinstance(stop, Stop) and stop.message.startswith("3 launches in a row failed before their first commit")
    assert m.failed_without_commit == 3


def test_the_same_error_on_different_hosts_is_the_programs_not_the_hosts() -> None:
    hosts = (Host("a", 1), Host("b", 1), Host("c", 1), Host("d", 1))
    m = Membership(Limits(min_np=1, max_np=1))
    error = "ValueError at train.py:88 in step"
    for name, expected_stop in (("a", False), ("b", False), ("c", True)):
        m.started(m.plan(hosts, now=0))  # type: ignore[arg-type]
        stop = m.ended(Ending.FAILED, {name: "rank 0 failed"}, committed=True, error=error)
        assert (stop is not None) == expected_stop
    assert stop is not None and stop.message == (
        "3 launches in a row failed with the same error (ValueError at train.py:88 in step) on 3 different hosts "
        "(a, b, c): that is the program, not the hosts. Fix the error (its traceback is above); relaunching "
        "would only blacklist more hosts. Stopping.")


def test_other_errors_in_between_or_one_host_do_not_count_as_the_programs() -> None:
    m = Membership(Limits(min_np=1, max_np=1, cooldown_range=(0.0, 0.0)))
    m.started(m.plan((A,), now=0))  # type: ignore[arg-type]
    for error in ("E at x.py:1 in f", "E at x.py:1 in f", None, "E at x.py:1 in f", "F at x.py:2 in g"):
        assert m.ended(Ending.FAILED, {"a": "rank 0 failed"} if error else {}, error=error) is None
    assert len(m.alike) == 1
    for _ in range(3):  # the same error, but always on host a: it may be the host
        assert m.ended(Ending.FAILED, {"a": "rank 0 failed"}, error="F at x.py:2 in g") is None


def test_every_host_burnt_by_one_error_says_it_is_the_program() -> None:
    m = Membership(Limits(min_np=1, max_np=1))
    for name in ("a", "b"):
        m.started(m.plan((A, B), now=0))  # type: ignore[arg-type]
        m.ended(Ending.FAILED, {name: "rank 0 failed"}, error="KeyError at data.py:7 in load")
    stop = m.plan((A, B), now=1)
    assert isinstance(stop, Stop) and stop.message.startswith(
        "every host the discovery script offers is blacklisted after failing (a:2, b:2); 1 ranks needed. 2 "
        "launches in a row failed with the same error (KeyError at data.py:7 in load) on 2 different hosts (a, b): "
        "that is the program, not the hosts.")


@pytest.mark.parametrize(("reason", "error"), [
    ("rank 2 (h, pid 1) failed: KeyError: 'x' at data.py:7 in load <- train.py:3 in main", "KeyError at data.py:7 in load"),
    ("rank 0 (h, pid 1) failed: torch.OutOfMemoryError: CUDA out of memory at m.py:5 in f", "torch.OutOfMemoryError at m.py:5 in f"),
    ("rank 0 (h, pid 1) failed: RuntimeError at m.py:5 in f", "RuntimeError at m.py:5 in f"),
    ("rank 0 (h, pid 1) failed: AbortedError: rank 1 stopped answering at m.py:5 in f", None),
    ("rank 0 (h, pid 1) failed: ValueError: bad", None),
    ("the job stalled (found by rank 0, h, pid 1): rank 1 has not submitted", None),
])
def test_error_of_reads_the_exception_and_its_line(reason: str, error: str | None) -> None:
    assert error_of(reason) == error
