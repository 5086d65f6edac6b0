"""The works and futures of the ``"unison"`` process group: what each call returns and how it completes.

Every call returns at once with a `UnisonWork`. A thread that waits for it finishes it (copies,
unison's error); once torch asks for its future (DDP's communication hooks chain on it), one completer
thread per group finishes it in submission order if no thread waits.
"""

# torch's stubs type Work.result as a list of tensors; a gather's work completes with a list per input.
# mypy: disable-error-code="override"

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..._job import runtime as _runtime
from ..._job.calls import Call
from ..._job.submit import steady_request

if TYPE_CHECKING:
    from typing import TypeAlias

    from ...engine.handles import Handle
    from ...process_sets import ProcessSet

    # what a call's work completes with: its output tensors (a list of them per input for the gathers)
    _Outputs: TypeAlias = list[torch.Tensor] | list[list[torch.Tensor]]

__all__ = ["DoneWork", "UnisonWork", "steady_work"]

_HALF = (torch.float16, torch.bfloat16)  # reduced through float32 pieces: always the usual way


class _Failed:
    """The value a work's inner future completes with when unison's collective failed."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _value(future: torch.futures.Future[_Outputs | _Failed]) -> _Outputs:
    """The inner future's value, raising unison's error in its place."""
    value = future.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class UnisonWork(dist._Work):
    """One call's completion: ``wait()`` returns once it finished (raising its error), ``get_future()``.

    Two futures: the inner one, completed with the outputs or a `_Failed` by the thread that waits or by
    the group's completer, and the one torch sees (`get_future`), chained on it. An error reaches torch's C++ side (DDP's reducer) only through
    that chain, which turns it into an error C++ can hold: a Python exception set on a future that
    DDP waits for directly crashed the process (torch 2.13, SIGSEGV).
    """

    def __init__(self, pending: _Pending, what: str, waits: Sequence[Handle], completer: _Completer,
                 wake: Callable[[], None]) -> None:
        super().__init__()
        self._pending = pending
        self._inner = pending.future
        self._completer = completer
        self._future: torch.futures.Future[_Outputs] | None = None  # made by get_future (a then() costs)
        self._what = what
        self._waits = list(waits)  # unison's own handles: a wait on them counts as blocked in unison
        self._wake = wake  # the engine thread, for a poll (the group's calls do not wake it: `lazily`)

    def __repr__(self) -> str:
        return f"<UnisonWork {self._what} {'done' if self._inner.done() else 'pending'}>"

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the call finished; raise its error (a `MismatchError`, a stall, an abort).

        The wait is on unison's handles first, so that a main thread blocked here counts as blocked in
        unison for the deadlock check (``UNISON_DEADLOCK_SECONDS``), as in unison's own synchronize.
        """
        self.settle()
        _value(self._inner)
        return True

    def is_completed(self) -> bool:
        """Whether the call finished (successfully or not); a poll of a call still pending asks the engine
        thread to run its cycle (nobody may wait for it)."""
        if not self._inner.done():
            if all(handle.done() for handle in self._waits):
                self._pending.run()
            else:
                self._wake()
        return self._inner.done()

    def is_success(self) -> bool:
        """Whether the call finished without an error."""
        return self._inner.done() and not isinstance(self._inner.value(), _Failed)

    def exception(self) -> BaseException | None:
        """The call's error once it failed, else None."""
        value = self._inner.value() if self._inner.done() else None
        return value.error if isinstance(value, _Failed) else None

    def get_future(self) -> torch.futures.Future[_Outputs]:
        """The future the call completes with its output tensors (DDP's hooks chain on it).

        From here on the group's completer thread finishes the call if no thread waits for it.
        """
        if self._future is None:
            self._future = self._inner.then(_value)
            self._completer.add(self._pending)
        return self._future

    def result(self) -> _Outputs:
        """The output tensors, once finished."""
        self.wait()
        return _value(self._inner)

    def settle(self) -> None:
        """Wait until finished, without raising (its error stays for its own wait)."""
        for handle in self._waits:
            handle.wait()
        self._pending.run()
        self._inner.wait()


class DoneWork(dist._Work):
    """The work of a call that finished before it was returned (the steady state's allreduce, run on the
    calling thread): nothing to wait for; a future, when torch asks for one, already done.

    Made with no ``__init__`` of its own and its outputs set after (`steady_work`): a Python ``__init__``
    over torch's C++ one costs more than the rest of the work's making, on every call in a loop."""

    _what = "allreduce"
    _future: torch.futures.Future[_Outputs] | None = None
    _outputs: _Outputs

    def __repr__(self) -> str:
        return f"<DoneWork {self._what}>"

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def get_future(self) -> torch.futures.Future[_Outputs]:
        if self._future is None:
            self._future = torch.futures.Future()
            self._future.set_result(self._outputs)
        return self._future

    def result(self) -> _Outputs:
        return self._outputs


def steady_work(tensor: torch.Tensor, resolved: tuple[Any, Any, float], name: str, process_set: ProcessSet,
                work_of: Callable[[str, Sequence[Call[Any]], Callable[[list[Any]], _Outputs]], UnisonWork],
                ) -> UnisonWork | DoneWork | None:
    """The steady state's allreduce of a group: one host tensor, the same call as before under `name`, its
    cycle run on this thread while the engine is idle (`unison._job.submit.steady_request`,
    `Engine.run_steady`); a `DoneWork` then, or, where its cycle became a whole one, the work (made by
    `work_of`) of the entry it became. None, having sent nothing, where the call goes the usual way.
    `resolved` is the op as `pg_ops._op` gives it. Each check here is one a call in a loop pays: ``Tensor.device`` makes an
    object and ``detach`` a tensor, so neither is asked for where a flag answers."""
    if (not tensor.is_cpu or tensor.layout != torch.strided or tensor.dtype in _HALF
            or not tensor.is_contiguous()):
        return None
    op, bitwise, factor = resolved
    if bitwise is not None or op is None:
        return None
    current = _runtime._job
    array = tensor.detach().numpy() if tensor.requires_grad else tensor.numpy()
    request = steady_request(current, array, name, op, factor, 1.0, process_set, True)
    if current is None or request is None:
        return None
    started = current.engine.run_steady(request, array, array)
    if started is False:
        return None
    outputs = [tensor]
    if started is True:
        done = DoneWork()
        done._outputs = outputs
        return done
    return work_of("allreduce", [Call([started.handle], list)], lambda results: outputs)


class _Pending:
    """One call to complete: unison's handles, how to finish, and the inner future it completes.

    Whoever comes first runs it: the group's completer thread, or a thread that waits for the work
    (its handles are done, so finishing costs nothing more than the wait it was doing anyway; the
    completer then finds it done). Exactly one of them synchronizes the handles.
    """

    __slots__ = ("_claimed", "_lock", "calls", "finish", "future", "on_error")

    # `finish` takes its calls' results (Any: each call's own)
    def __init__(self, calls: list[Call[Any]], finish: Callable[[list[Any]], _Outputs],
                 future: torch.futures.Future[_Outputs | _Failed],
                 on_error: Callable[[BaseException], None]) -> None:
        self.calls, self.finish, self.future, self.on_error = calls, finish, future, on_error
        self._lock = threading.Lock()
        self._claimed = False

    def run(self) -> None:
        """Complete the future, unless another thread did or is doing it (then return at once)."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        try:
            results = [call.result() for call in self.calls]
            value = self.finish(results)
        except BaseException as exc:  # noqa: BLE001 - delivered through the work (see UnisonWork)
            self.on_error(exc)
            self.future.set_result(_Failed(exc))
        else:
            self.future.set_result(value)


class _Completer:
    """One thread that completes works in submission order from unison's handles."""

    def __init__(self, label: str) -> None:
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._label = label
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, pending: _Pending) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"unison-{self._label}", daemon=True)
                self._thread.start()
        self._queue.put(pending)

    def stop(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None

    def _run(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            pending.run()


def _outside_dynamo() -> None:
    """Keep a work's waits out of torch.compile's tracing: a wait may drive unison's engine cycle on the
    waiting thread, and DDP waits for its bucket broadcast inside a compiled model's forward (torch's own
    lazy wrapper: dynamo is imported at the first call, where torch's optimizers have imported it already)."""
    disable = getattr(torch, "_disable_dynamo", None)
    if disable is None:
        return
    for name in ("wait", "is_completed", "get_future", "result", "settle"):
        setattr(UnisonWork, name, disable(getattr(UnisonWork, name)))
    for name in ("wait", "get_future", "result"):
        setattr(DoneWork, name, disable(getattr(DoneWork, name)))


_outside_dynamo()
