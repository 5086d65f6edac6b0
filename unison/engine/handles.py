"""What a submitted collective is on this rank: its `Entry` (request, buffers) and the `Handle` it completes.

Every submit makes one of each; the engine's loop and executor, the GPU plane and the submit path share
them, so they live apart from all of those and import nothing of the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..protocol.messages import Request

__all__ = ["Entry", "Handle", "begin_main_wait", "defer_interrupt", "enter_main_cycle", "for_a_graph",
           "leave_main_cycle", "main_runs_a_cycle", "main_thread_waits", "main_wait_number"]

_MAIN_THREAD = threading.main_thread().ident
_main_waiting: list[Handle | None] = [None]  # the handle the main thread waits for: written by it alone
# How many waits the main thread has begun (a graph's ops' waits count as its own): a rank whose main
# thread is seen blocked with the same number twice waited all along (`main_wait_number`). Graph ops
# may add from several threads at once and lose an addition; the number still changes.
_main_waits = [0]
_graph_waiting: dict[int, Handle] = {}  # thread -> the handle it waits for in a TensorFlow graph's op
_in_graph_op = threading.local()  # .active: this thread runs a unison op of a TensorFlow graph
# The main thread's innermost Python frame while it runs a TensorFlow graph (a tf.function, Keras's
# train step, a v1 session) in C: (function, file), in a file under tensorflow/.
_GRAPH_CALLS = frozenset({("quick_execute", "execute.py"), ("_call_tf_sessionrun", "session.py")})
# The main thread runs a cycle of the job (a blocking call's own, `Engine.drive`): a SIGINT then waits
# for the cycle's end (`defer_interrupt`), since peers cannot finish a cycle this rank left half way.
# Both are written by the main thread alone.
_main_cycle = [False, False]  # [in a cycle, an interrupt arrived meanwhile]


def enter_main_cycle() -> None:
    """The main thread starts running a cycle of the job (`Engine.drive`); see `defer_interrupt`."""
    _main_cycle[0] = True


def main_runs_a_cycle() -> bool:
    """True while the main thread runs a cycle of the job: a blocking call of its own, which returns or
    raises the job's error when the cycle ends (the engine need not interrupt it if the job stops)."""
    return _main_cycle[0]


def leave_main_cycle() -> bool:
    """The main thread's cycle ended; return whether a SIGINT was held meanwhile (raise it now)."""
    _main_cycle[0] = False
    held, _main_cycle[1] = _main_cycle[1], False
    return held


def defer_interrupt() -> bool:
    """For a SIGINT handler on the main thread: True (the interrupt is held) while the main thread runs a
    cycle of the job; the engine raises `KeyboardInterrupt` as soon as that cycle ends."""
    if _main_cycle[0]:
        _main_cycle[1] = True
        return True
    return False


@contextlib.contextmanager
def for_a_graph() -> Iterator[None]:
    """Count this thread's waits in the block as the main thread's when the main thread runs a
    TensorFlow graph meanwhile: a graph's unison op waits in one of TensorFlow's threads, while the
    main thread that runs the graph waits in C for the graph to end (`main_thread_waits`)."""
    _in_graph_op.active = True
    try:
        yield
    finally:
        _in_graph_op.active = False


def begin_main_wait() -> None:
    """The main thread begins a blocking call that waits without a `Handle` (the steady state's call,
    `unison.engine.loop.Engine.run_steady`): count it as `Handle.wait` counts its own."""
    _main_waits[0] += 1


def main_wait_number() -> int:
    """How many waits the main thread has begun so far (`unison.protocol.places.Place.wait_number`)."""
    return _main_waits[0]


def main_thread_waits() -> bool:
    """True while the main thread is blocked in unison (the engine's deadlock flag reads it): in
    `Handle.wait` on a handle not yet done, or in a TensorFlow graph whose unison ops all wait, in
    TensorFlow's threads, on handles not yet done (`for_a_graph`). A done handle's waiter is about to
    run on, however long the machine takes to schedule it: it is not blocked.

    A graph waits as a whole: while its unison ops wait, the main thread cannot go on, and the graph
    submits nothing more unless another of its ops becomes ready to run; one that needs more than the
    deadlock window (``UNISON_DEADLOCK_SECONDS``) of compute first is the case that setting is for.
    """
    waiting = _main_waiting[0]
    if waiting is not None and not waiting._done:
        return True
    in_graph = list(_graph_waiting.values())
    return bool(in_graph) and not any(handle._done for handle in in_graph) and _main_runs_a_graph()


def _main_runs_a_graph() -> bool:
    """True when the main thread's innermost Python frame is TensorFlow's call into a graph."""
    frame = sys._current_frames().get(_MAIN_THREAD)  # type: ignore[arg-type]
    if frame is None:
        return False
    code = frame.f_code
    return ((code.co_name, os.path.basename(code.co_filename)) in _GRAPH_CALLS
            and f"{os.sep}tensorflow{os.sep}" in code.co_filename)


class Handle:
    """Completion of one submitted collective: poll `done()`, then read `result` or raise `error`.

    A plain lock, held from creation until completion, makes waiting cheap: completing releases it,
    and each waiter acquires and re-releases it so any number of threads may wait. A handle made with a
    `driver` (the engine's `Engine.drive`) lets its waiter run the job's cycles itself while no other
    thread runs one, before it blocks.
    """

    __slots__ = ("_done", "_lock", "driver", "error", "name", "result")

    def __init__(self, name: str, driver: Callable[[Handle, float | None], None] | None = None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.driver = driver

    def __repr__(self) -> str:
        state = "failed" if self.error else ("done" if self._done else "pending")
        return f"<Handle {self.name!r} {state}>"

    def done(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; return False on timeout."""
        if self._done:
            return True
        thread = threading.get_ident()
        main = thread == _MAIN_THREAD
        in_graph = not main and getattr(_in_graph_op, "active", False)
        if main:
            _main_waiting[0] = self
            _main_waits[0] += 1
        elif in_graph:
            _graph_waiting[thread] = self
            _main_waits[0] += 1
        try:
            if self.driver is not None:
                deadline = None if timeout is None else time.monotonic() + timeout
                self.driver(self, deadline)
                if self._done:
                    return True
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                return False
        finally:
            if main:
                _main_waiting[0] = None
            elif in_graph:
                _graph_waiting.pop(thread, None)
        self._lock.release()
        return True

    def wait_released(self, timeout: float) -> bool:
        """Block at most `timeout` seconds for completion, as one more pause of a waiter that is
        already counted as waiting (`Engine.drive` between cycles); True once done."""
        if self._lock.acquire(timeout=timeout):
            self._lock.release()
            return True
        return self._done

    def complete(self, result: Any) -> None:
        """Record the result and wake waiters (engine thread only)."""
        if not self._done:
            self.result = result
            self._done = True
            self._lock.release()

    def fail(self, error: BaseException) -> None:
        """Record the error and wake waiters (engine thread only)."""
        if not self._done:
            self.error = error
            self._done = True
            self._lock.release()


@dataclasses.dataclass(eq=False)
class Entry:
    """A request submitted on this rank, with its buffers and handle.

    Attributes:
        request: what was asked.
        input: the local buffer (storage dtype; bfloat16 as uint16 bits), or None for barrier/join.
        output: where an allreduce/broadcast writes (the input itself for in-place forms).
        handle: completed by the executor.
        slot: response-cache slot this request hit, or -1.
        group: the entries submitted with it as one atomic group (including itself).
    """

    request: Request
    input: np.ndarray | None
    output: np.ndarray | None
    handle: Handle
    slot: int = -1
    group: list[Entry] | None = None
