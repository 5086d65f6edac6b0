"""The submission queue: groups in order, batches, the naming rule, shutdown and abort taken once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from unison.dtypes import DType
from unison.engine.handles import Entry, Handle
from unison.engine.queue import SubmissionQueue, user_name
from unison.errors import DuplicateNameError, ShutdownError
from unison.ops import CollectiveKind
from unison.protocol.messages import Request


def entry(name: str, kind: CollectiveKind = CollectiveKind.ALLREDUCE) -> Entry:
    value = np.zeros(1, np.float32)
    return Entry(Request(name, kind, 0, DType.FLOAT32, (1,)), value, value, Handle(name))


def opened() -> SubmissionQueue:
    queue = SubmissionQueue(lambda: ShutdownError("stopped for the test"))
    queue.open()
    return queue


def test_refuses_before_open_and_after_close_with_the_refusal() -> None:
    queue = SubmissionQueue(lambda: ShutdownError("stopped for the test"))
    with pytest.raises(ShutdownError, match="stopped for the test"):
        queue.put([entry("allreduce.a")])
    queue.open()
    queue.put([entry("allreduce.a")])
    assert [e.request.name for e in queue.close()] == ["allreduce.a"]
    with pytest.raises(ShutdownError, match="stopped for the test"):
        queue.put([entry("allreduce.b")])
    assert queue.counts() == (0, 0)


def test_take_returns_groups_in_order_once_and_links_each_group() -> None:
    queue = opened()
    a, b, c = entry("allreduce.a"), entry("allreduce.b"), entry("allreduce.c")
    queue.put([a])
    queue.put([b, c])
    assert queue.has_work() and queue.counts() == (2, 0)
    drained = queue.take()
    assert drained.groups == [[a], [b, c]]
    assert a.group is None and b.group is c.group == [b, c]
    assert (drained.shutdown, drained.abort_reason) == (False, "")
    assert queue.take().groups == [] and not queue.has_work()


def test_one_user_name_in_flight_until_released() -> None:
    queue = opened()
    queue.put([entry("allreduce.x")])
    with pytest.raises(DuplicateNameError, match="another tensor with that name is still being processed"):
        queue.put([entry("allreduce.x")])
    with pytest.raises(DuplicateNameError, match="'allreduce.x' is still being processed"):
        queue.put([entry("broadcast.x", CollectiveKind.BROADCAST)])
    with pytest.raises(DuplicateNameError):
        queue.put([entry("allreduce.y"), entry("allreduce.y")])
    queue.release("allreduce.x")
    queue.put([entry("broadcast.x", CollectiveKind.BROADCAST)])
    assert user_name("broadcast.x") == "x"


def test_a_batch_holds_until_the_outermost_block_ends() -> None:
    queue = opened()
    with queue.batch():
        queue.put([entry("allreduce.a")])
        with queue.batch():
            queue.put([entry("allreduce.b")])
        assert queue.counts() == (0, 2) and not queue.has_work()
    assert queue.counts() == (2, 0)
    assert [g[0].request.name for g in queue.take().groups] == ["allreduce.a", "allreduce.b"]


def test_close_returns_held_entries_and_keeps_open_batches_known() -> None:
    queue = opened()
    with queue.batch():
        queue.put([entry("allreduce.a")])
        assert [e.request.name for e in queue.close()] == ["allreduce.a"]
        assert queue.counts() == (0, 0)
    assert queue.counts() == (0, 0)


def test_shutdown_and_abort_are_taken_once_and_the_first_abort_reason_wins() -> None:
    queue = opened()
    queue.request_abort("first")
    queue.request_abort("second")
    queue.request_shutdown()
    assert queue.has_work()
    drained = queue.take()
    assert (drained.shutdown, drained.abort_reason) == (True, "first")
    again = queue.take()
    assert (again.shutdown, again.abort_reason) == (False, "")
    assert not queue.has_work()


def test_put_wakes_a_waiting_thread() -> None:
    queue = opened()
    woke = threading.Event()

    def waiter() -> None:
        queue.wait(10.0)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    queue.put([entry("allreduce.a")])
    thread.join(10.0)
    assert woke.is_set()
    queue.clear_wake()
