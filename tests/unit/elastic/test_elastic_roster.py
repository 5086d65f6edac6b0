"""Which worker holds which rank of an epoch, and what a worker is told when it asks (pure)."""

from __future__ import annotations

import pytest

from unison.elastic.membership import Epoch, Host
from unison.elastic.roster import Assignment, Leave, Phase, Roster, Wait, assign

A2, B1, C1 = Host("a", 2), Host("b", 1), Host("c", 1)


def test_survivors_keep_their_order_on_their_host_and_new_slots_need_new_workers() -> None:
    epoch = Epoch(3, (A2, C1, B1))
    assert assign(epoch, {"a": ["w4", "w0"], "b": ["w1"]}) == ["w4", "w0", None, "w1"]
    assert assign(epoch, {}) == [None] * 4


def test_survivors_beyond_their_hosts_slots_or_of_hosts_gone_get_no_rank() -> None:
    assert assign(Epoch(1, (Host("a", 1),)), {"a": ["w0", "w1"], "z": ["w2"]}) == ["w0"]


def test_a_worker_is_told_its_epoch_once_it_runs_then_waits_for_the_next() -> None:
    roster = Roster()
    assert roster.answer("w0", after=-1) == Wait()  # nothing decided yet
    first = Epoch(0, (A2,))
    roster.begin(first, ["w0", "w1"])
    assert roster.phase is Phase.RUNNING
    assert roster.answer("w1", after=-1) == Assignment(first, 1)
    assert roster.answer("w1", after=0) == Wait()  # it runs epoch 0 already
    assert roster.joined == {"w1"}
    roster.end()
    assert roster.answer("w0", after=-1) == Wait()  # the next epoch is being decided
    second = Epoch(1, (A2, B1))
    roster.begin(second, ["w0", "w1", "w2"])
    assert roster.answer("w0", after=0) == Assignment(second, 0)
    assert roster.answer("w2", after=-1) == Assignment(second, 2)


def test_a_worker_without_a_place_is_told_to_leave() -> None:
    roster = Roster()
    roster.begin(Epoch(0, (A2,)), ["w0", "w1"])
    roster.end()
    roster.dismiss("w1", "not a member of epoch 1")
    roster.begin(Epoch(1, (Host("a", 1),)), ["w0"])
    assert roster.answer("w1", after=0) == Leave("not a member of epoch 1")
    assert roster.answer("w9", after=-1) == Leave("not a member of epoch 1")


def test_a_dismissed_worker_given_a_place_again_joins() -> None:
    roster = Roster()
    roster.dismiss("w1", "host left")
    roster.begin(Epoch(0, (A2,)), ["w0", "w1"])
    assert isinstance(roster.answer("w1", after=-1), Assignment)


def test_every_member_stopped_ends_nothing_until_all_did() -> None:
    roster = Roster()
    roster.begin(Epoch(4, (A2,)), ["w0", "w1"])
    roster.stopped("w0", 4)
    roster.stopped("w1", 3)  # a stale report: another epoch
    roster.stopped("w7", 4)  # not a member
    assert not roster.all_stopped()
    roster.stopped("w1", 4)
    assert roster.all_stopped()
    roster.end()
    assert not roster.all_stopped()


def test_ranks_reported_lost_name_their_workers_but_never_a_reporter() -> None:
    roster = Roster()
    roster.begin(Epoch(2, (A2, B1, C1)), ["w0", "w1", "w2", "w3"])
    roster.broken("w0", 2, [2, 9, -1])  # out-of-range ranks are ignored
    roster.broken("w1", 2, [0, 2])  # w0 reported itself, so it is not lost
    assert roster.lost_workers() == ["w2"]
    assert roster.broken_reports == {"w0": (2,), "w1": (0, 2)}


def test_an_epoch_needs_one_member_per_rank() -> None:
    with pytest.raises(ValueError, match="epoch 0 has 2 ranks, but 1 members were given"):
        Roster().begin(Epoch(0, (A2,)), ["w0"])
