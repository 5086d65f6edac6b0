"""What a submission returns: a `Call`, one typed completion for every API that submits collectives.

`unison._job.submit.submit` returns a `Call` over the engine's handles of the submission (one per
tensor) with a function from their raw results to what the caller gets; `then` composes another on
top, so each layer adds its own step (a NumPy result restored to bfloat16, a torch tensor around a
buffer, a process group's copy into the caller's tensors) without a table in between. Horovod's
integer handles are an index into the job's table of calls (`handle_of`), nothing more.

Waiting runs the job's cycles on the waiting thread where it can (`unison.engine.handles.Handle.wait`).
A collective that failed raises, in the waiting thread, a fresh copy of the engine's error whose cause
(``__cause__``: the exception behind it, when the engine had one) is the engine error's own.

Example:
    >>> from unison.engine.handles import Handle
    >>> handle = Handle("allreduce.x")
    >>> call = Call([handle], lambda results: results[0]).then(lambda value: value * 2)
    >>> handle.complete(21)
    >>> call.done(), call.result()
    (True, 42)
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..engine.handles import Handle

__all__ = ["Call"]

T = TypeVar("T")
U = TypeVar("U")

_PENDING, _VALUE, _ERROR = 0, 1, 2


def _fresh(error: BaseException) -> BaseException:
    """A copy of `error` to raise in a waiting thread (the engine's own object is shared by every waiter),
    with its attributes; the error itself where it cannot be copied."""
    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception type that cannot be rebuilt from its arguments
        return error
    fresh.__traceback__ = None
    return fresh


class Call(Generic[T]):
    """One submission's completion: `done`, `wait`, `result`, `exception`, and `then` for a continuation.

    Args:
        handles: the engine's handles of the submission, one per tensor (none for an empty group).
        finish: turns their raw results, in order, into the call's value; it runs once, in the first
            thread that asks for the result.
    """

    __slots__ = ("_engines", "_finish", "_handles", "_lock", "_outcome", "_state")

    def __init__(self, handles: Sequence[Handle], finish: Callable[[list[Any]], T]) -> None:
        self._handles = tuple(handles)
        self._finish = finish
        self._lock = threading.Lock()
        self._state = _PENDING
        self._outcome: Any = None
        self._engines = False  # the error is the engine's (not the finishing step's own)

    @classmethod
    def completed(cls, value: T) -> Call[T]:
        """A call already done with `value` (a group of no tensors)."""
        call: Call[T] = cls((), lambda results: value)
        return call

    def __repr__(self) -> str:
        names = ", ".join(handle.name for handle in self._handles[:3])
        more = f", ... ({len(self._handles)})" if len(self._handles) > 3 else ""
        return f"<Call [{names}{more}] {'done' if self.done() else 'pending'}>"

    @property
    def handles(self) -> tuple[Handle, ...]:
        """The engine's handles of the submission (a wait on them counts as waiting in unison)."""
        return self._handles

    def done(self) -> bool:
        """Whether every tensor of the submission finished, successfully or not."""
        return all(handle._done for handle in self._handles)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (running the job's cycles on this thread where it can); False on timeout."""
        if timeout is None:
            for handle in self._handles:
                handle.wait()
            return True
        deadline = time.monotonic() + timeout
        return all(handle.wait(max(0.0, deadline - time.monotonic())) for handle in self._handles)

    def result(self, timeout: float | None = None) -> T:
        """The call's value once done; raise the collective's error (a `MismatchError`, a stall, an abort).

        Raises:
            TimeoutError: not done within `timeout` seconds.
        """
        if self._state == _PENDING:
            self._settle(timeout)
        if self._state == _ERROR:
            error: BaseException = self._outcome
            if self._engines:  # the engine's error, shared by every waiter: raise a copy of it
                raise _fresh(error) from error.__cause__
            raise error  # the finishing step's own, raised where it was: with its traceback
        value: T = self._outcome
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The collective's error once done (None when it succeeded)."""
        if self._state == _PENDING:
            self._settle(timeout)
        return self._outcome if self._state == _ERROR else None  # type: ignore[no-any-return]

    def then(self, step: Callable[[T], U]) -> Call[U]:
        """A call over the same tensors whose value is ``step(this call's value)``; an error passes through."""
        finish = self._finish
        return Call(self._handles, lambda results: step(finish(results)))

    def _settle(self, timeout: float | None) -> None:
        """Wait, then compute the outcome once (under the lock: `finish` may copy into the caller's memory)."""
        if not self.wait(timeout):
            raise TimeoutError(f"{self!r} did not finish within {timeout} s.")
        with self._lock:
            if self._state != _PENDING:
                return
            error = next((handle.error for handle in self._handles if handle.error is not None), None)
            if error is not None:
                self._outcome, self._state, self._engines = error, _ERROR, True
                return
            try:
                self._outcome = self._finish([handle.result for handle in self._handles])
            except BaseException as exc:  # noqa: BLE001 - the finishing step's own failure is the call's
                self._outcome, self._state = exc, _ERROR
                return
            self._state = _VALUE
