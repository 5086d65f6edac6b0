"""A server's roster of trainers on a hand-moved clock: who is lost, when the work is over, who was told of a failure."""

from __future__ import annotations

import pytest

from unison.errors import RequestError, TrainerLostError
from unison.ps._roster import Roster


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_trainer_is_lost_after_the_timeout_and_found_when_heard_again() -> None:
    clock = Clock()
    roster = Roster(3, 2, sync=False, timeout_seconds=5.0, clock=clock)
    with pytest.raises(RequestError, match=r"^trainer must be in range\(num_trainers=2\)\. Got trainer=-1\.$"):
        roster.heartbeat(-1)
    roster.seen(0, host="a", pid=10)
    clock.now += 6.0
    assert roster.lost() == {1: "trainer 1 never connected (6.0 s after the first)",
                             0: "trainer 0 (a, pid 10) sent nothing for 6.0 s; it died or is stopped"}
    roster.seen(1, host="b", pid=11)
    roster.heartbeat(0)
    assert roster.lost() == {}
    assert roster.trainers[0].first_seen == 50.0 and roster.trainers[0].last_seen == 56.0


def test_the_work_is_over_when_every_trainer_finished_or_the_rest_are_lost() -> None:
    clock = Clock()
    roster = Roster(0, 2, sync=False, timeout_seconds=5.0, clock=clock)
    roster.seen(0, host="a", pid=10), roster.seen(1, host="b", pid=11)
    assert roster.finish(0) == 1
    assert roster.end_reason() == ""
    clock.now += 5.5
    assert roster.end_reason() == "trainer 0 finished; trainer 1 (b, pid 11) sent nothing for 5.5 s; it died or is stopped"
    assert roster.finish(1) == 2
    assert roster.end_reason() == "every trainer finished"


def test_a_failed_sync_step_is_kept_once_and_told_to_each_trainer_that_calls() -> None:
    clock = Clock()
    roster = Roster(0, 3, sync=True, timeout_seconds=5.0, clock=clock)
    for trainer in range(3):
        roster.seen(trainer, host="h", pid=20 + trainer, pushed=0)
    roster.check_failure(1)  # no failure: nothing happens
    clock.now += 1.0
    roster.seen(0), roster.seen(1)
    clock.now += 5.0
    assert roster.blockers(1, {0, 1}) == [
        "trainer 2 (h, pid 22) pushed steps up to 0 and sent nothing for 6.0 s; it died or is stopped"]
    roster.fail(0, "step 1 failed")
    roster.fail(1, "step 1 failed later")  # the first failure is the one kept
    assert (roster.failure, roster.told) == ("step 1 failed", {0, 1})
    assert roster.end_reason() == ("synchronous training stopped: step 1 failed; trainers 0, 1 got the error; trainer 2 "
                                   "(h, pid 22) pushed steps up to 0 and sent nothing for 6.0 s; it died or is stopped")
    roster.told.discard(1)
    with pytest.raises(TrainerLostError, match=r"^step 1 failed$"):
        roster.check_failure(1)
    assert roster.told == {0, 1}
    assert roster.statistics()["lost_trainers"] == {
        "2": "trainer 2 (h, pid 22) pushed steps up to 0 and sent nothing for 6.0 s; it died or is stopped"}
