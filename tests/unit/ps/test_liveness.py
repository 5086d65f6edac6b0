"""The server's end: decided under its lock from the roster, logged as trainers are lost and found, recorded for the launcher."""

from __future__ import annotations

import logging
import threading

import pytest

from unison.ps._liveness import Liveness
from unison.ps._roster import Roster


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_lost_trainers_are_logged_once_and_the_end_is_recorded(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    roster = Roster(1, 2, sync=False, timeout_seconds=2.0, clock=clock)
    changed = threading.Condition()
    liveness = Liveness(1, roster, changed)
    roster.seen(0, host="a", pid=5), roster.seen(1, host="b", pid=6)
    caplog.set_level(logging.INFO, logger="unison.ps._liveness")
    clock.now += 3.0
    roster.seen(0)
    with changed:
        liveness.check(), liveness.check()
    assert [r.getMessage() for r in caplog.records] == [
        "parameter server 1 counts trainer 1 (b, pid 6) sent nothing for 3.0 s; it died or is stopped"]
    assert not liveness.finished.is_set()
    roster.seen(1)
    with changed:
        liveness.check()
    assert caplog.records[-1].getMessage() == "parameter server 1 hears from trainer 1 again"
    roster.finish(1)
    clock.now += 2.5
    with changed:
        liveness.check()
    assert liveness.finished.is_set()
    assert liveness.reason == "trainer 1 finished; trainer 0 (a, pid 5) sent nothing for 2.5 s; it died or is stopped"
    assert liveness.record() == {"server": 1, "reason": liveness.reason, "lost": {
        "0": {"host": "a", "pid": 5, "why": "trainer 0 (a, pid 5) sent nothing for 2.5 s; it died or is stopped"}}}


def test_the_watching_thread_ends_when_the_work_is_over() -> None:
    roster = Roster(0, 1, sync=False, timeout_seconds=2.0)
    liveness = Liveness(0, roster, threading.Condition())
    thread = threading.Thread(target=liveness.run, args=(threading.Event(),), daemon=True)
    thread.start()
    roster.finish(0)
    assert liveness.finished.wait(5.0)
    thread.join(5.0)
    assert not thread.is_alive() and liveness.reason == "every trainer finished"
