"""What a submitted collective is on this rank: its `Entry` (request, buffers) and the `Handle` it completes.

Every submit makes one of each; the engine's loop and executor, the GPU plane and the submit path share
them, so they live apart from all of those and import nothing of the engine.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from ..protocol.messages import Request

__all__ = ["Entry", "Handle", "main_thread_waits"]

_MAIN_THREAD = threading.main_thread().ident
_main_waiting: list[Handle | None] = [None]  # the handle the main thread waits for: written by it alone


def main_thread_waits() -> bool:
    """True while the main thread is blocked in `Handle.wait` on a handle not yet done (the engine's
    deadlock flag reads it). A done handle's waiter is about to run on, however long the machine
    takes to schedule it: it is not blocked."""
    waiting = _main_waiting[0]
    return waiting is not None and not waiting._done


class Handle:
    """Completion of one submitted collective: poll `done()`, then read `result` or raise `error`.

    A plain lock, held from creation until completion, makes waiting cheap: completing releases it,
    and each waiter acquires and re-releases it so any number of threads may wait.
    """

    __slots__ = ("_done", "_lock", "error", "name", "result")

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self.result: Any = None
        self.error: BaseException | None = None

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
        main = threading.get_ident() == _MAIN_THREAD
        if main:
            _main_waiting[0] = self
        try:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                return False
        finally:
            if main:
                _main_waiting[0] = None
        self._lock.release()
        return True

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
