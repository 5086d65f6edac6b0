"""A handle's waiters, and what the engine's deadlock flag reads of the main thread's wait."""

from __future__ import annotations

import threading
import time

from unison.engine.handles import Handle, for_a_graph, main_thread_waits


def test_the_main_thread_counts_as_blocked_only_while_its_handle_is_not_done() -> None:
    handle = Handle("allreduce.x")
    seen: dict[str, bool] = {}

    def engine() -> None:
        deadline = time.monotonic() + 10
        while not main_thread_waits() and time.monotonic() < deadline:
            time.sleep(0.001)
        seen["while waiting"] = main_thread_waits()
        handle.complete(1)
        # done: the main thread is about to run on, however long it takes to be scheduled
        seen["once done"] = main_thread_waits()

    worker = threading.Thread(target=engine)
    worker.start()
    assert handle.wait(timeout=10)
    worker.join()
    assert seen == {"while waiting": True, "once done": False}
    assert not main_thread_waits()


def test_a_graph_ops_wait_counts_only_while_the_main_thread_runs_a_graph() -> None:
    # A thread of a TensorFlow graph waits; the main thread runs Python, not a graph, so it could
    # still submit: not blocked. (tests/faults/test_lifecycle.py has the blocked case: a Keras step.)
    handle = Handle("grouped_allreduce.grads")
    seen: dict[str, bool] = {}
    started = threading.Event()

    def graph_op() -> None:
        with for_a_graph():
            started.set()
            handle.wait(timeout=10)

    worker = threading.Thread(target=graph_op)
    worker.start()
    started.wait(10)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        seen["while the main thread runs Python"] = main_thread_waits()
        time.sleep(0.01)
    handle.complete(1)
    worker.join()
    assert seen == {"while the main thread runs Python": False}


def test_waits_outside_a_graph_op_of_another_thread_never_count() -> None:
    handle = Handle("allreduce.x")
    worker = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
    worker.start()
    time.sleep(0.05)
    try:
        assert not main_thread_waits()
    finally:
        handle.complete(1)
        worker.join()
