"""A handle's waiters, and what the engine's deadlock flag reads of the main thread's wait."""

from __future__ import annotations

import threading
import time

from unison.engine.handles import Handle, main_thread_waits


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

