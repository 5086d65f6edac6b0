"""torch.distributed's ``"unison"`` backend: a Python ProcessGroup whose collectives run through unison.

``dist.init_process_group("unison")`` (after ``import unison.torch``) makes a `UnisonProcessGroup`:
DDP, ZeroRedundancyOptimizer, FSDP2 and plain ``dist.*`` calls then go through unison's engine, so the
coordinator checks every collective before any data moves. torch's collectives carry no names; each
call here is named from the calls before it (`call_names`: ``torch.<group>.<n>``, and once the
program repeats, names that recur with it so that unison's response cache serves them), the same on
every rank that runs the same program. Two ranks at different points of their programs then ask for different
collectives, shapes or dtypes under one name, and every rank gets a `MismatchError` naming the ranks
and both calls from the work's ``wait()`` (out of DDP's ``backward()``), instead of a watchdog timeout.

Every call returns at once with a `UnisonWork`. A thread that waits for it finishes it (copies,
unison's error); once torch asks for its future (DDP's communication hooks chain on it), one completer
thread per group finishes it in submission order if no thread waits. Calls that unison has no collective for are composed exactly:
``reduce`` and ``gather`` from the allreduce and allgather (the root keeps the result), ``scatter``
from an alltoall in which only the root sends, the bitwise ops from an allgather reduced locally.
Point-to-point calls raise an error that names the call.

``dist.new_group(ranks)`` of a subset runs on a unison process set of those ranks: torch calls the
backend on the group's members only, but every rank calls ``new_group`` (torch's contract), so
`register` wraps torch's group creation to register the set on every rank first (`process_set_of`).
"""

# torch's stubs declare ProcessGroup's methods as overloads of its C++ and Python forms; a Python
# group overrides the form torch's c10d calls (tensor lists and an options object).
# mypy: disable-error-code="override,assignment"

from __future__ import annotations

import inspect
import logging
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from datetime import timedelta
from functools import reduce as fold
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..._job import runtime as _runtime
from ..._job.objects import process_set_of, registered_set_of
from ...errors import InvalidArgumentError, UnisonError, UnisonNotImplementedError
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from .call_names import MIN_WINDOW, CallNames
from .collectives import (
    allgather_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async_,
    grouped_allreduce_async_,
    reducescatter_async,
    synchronize,
)

if TYPE_CHECKING:
    from typing import TypeAlias, TypeVar

    from torch._C._distributed_c10d import AllgatherOptions, _DistributedBackendOptions

    from ...engine.handles import Handle

    # what a call's work completes with: its output tensors (a list of them per input for the gathers)
    _Outputs: TypeAlias = list[torch.Tensor] | list[list[torch.Tensor]]
    # a torch reduce op as c10d hands it: an options object's ReduceOp, or a member such as ReduceOp.SUM
    _TorchOp: TypeAlias = dist.ReduceOp | dist.ReduceOp.RedOpType
    _R = TypeVar("_R")  # what a wrapped function returns

__all__ = ["BACKEND_NAME", "UnisonProcessGroup", "UnisonWork", "create_process_group", "job_store", "register"]

log = logging.getLogger(__name__)

BACKEND_NAME = "unison"
_RED: Any = dist.ReduceOp.RedOpType  # its members are missing from torch's stubs
_OPS = {_RED.SUM: ReduceOp.SUM, _RED.AVG: ReduceOp.AVERAGE, _RED.PRODUCT: ReduceOp.PRODUCT,
        _RED.MIN: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX, _RED.PREMUL_SUM: ReduceOp.SUM}
_BITWISE: dict[dist.ReduceOp.RedOpType, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    _RED.BAND: torch.bitwise_and, _RED.BOR: torch.bitwise_or, _RED.BXOR: torch.bitwise_xor}
_group_count: dict[int, int] = {}  # process set id -> groups made on it here (the same on every member)
_group_lock = threading.Lock()


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

    def __init__(self, pending: _Pending, what: str, waits: Sequence[Handle], completer: _Completer) -> None:
        super().__init__()
        self._pending = pending
        self._inner = pending.future
        self._completer = completer
        self._future: torch.futures.Future[_Outputs] | None = None  # made by get_future (a then() costs)
        self._what = what
        self._waits = list(waits)  # unison's own handles: a wait on them counts as blocked in unison

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
        """Whether the call finished (successfully or not)."""
        if not self._inner.done() and all(handle.done() for handle in self._waits):
            self._pending.run()
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


class _Pending:
    """One call to complete: unison's handles, how to finish, and the inner future it completes.

    Whoever comes first runs it: the group's completer thread, or a thread that waits for the work
    (its handles are done, so finishing costs nothing more than the wait it was doing anyway; the
    completer then finds it done). Exactly one of them synchronizes the handles.
    """

    __slots__ = ("_claimed", "_lock", "finish", "future", "handles", "on_error")

    # `finish` takes its handles' results (Any: each call's own, from unison's synchronize)
    def __init__(self, handles: list[int], finish: Callable[[list[Any]], _Outputs],
                 future: torch.futures.Future[_Outputs | _Failed],
                 on_error: Callable[[BaseException], None]) -> None:
        self.handles, self.finish, self.future, self.on_error = handles, finish, future, on_error
        self._lock = threading.Lock()
        self._claimed = False

    def run(self) -> None:
        """Complete the future, unless another thread did or is doing it (then return at once)."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        try:
            results = [synchronize(handle) for handle in self.handles]
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


def _op(reduce_op: _TorchOp) -> tuple[ReduceOp | None, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, float]:
    """unison's op (or a local bitwise fold) and the premultiplier of a torch ReduceOp."""
    kind = getattr(reduce_op, "op", reduce_op)
    if kind in _BITWISE:
        return None, _BITWISE[kind], 1.0
    if kind not in _OPS:
        raise UnisonNotImplementedError(f"The unison backend has no reduce op {kind}.")
    factor = _premul_factor(reduce_op) if kind == _RED.PREMUL_SUM else 1.0
    return _OPS[kind], None, factor


def _premul_factor(reduce_op: _TorchOp) -> float:
    """PREMUL_SUM's factor: ``ReduceOp.factor`` from torch 2.12 on, the pickled state before (2.11 has no
    ``factor``); never 1.0 by default, which would sum unscaled without a word."""
    raw = getattr(reduce_op, "factor", None)
    if raw is None:
        state = getattr(reduce_op, "__getstate__", lambda: ())()
        raw = state[1] if isinstance(state, tuple) and len(state) == 2 else None
    if raw is None:
        raise UnisonNotImplementedError(
            f"The unison backend cannot read the factor of {reduce_op!r} (PREMUL_SUM) in torch {torch.__version__}; "
            "scale the tensor and use ReduceOp.SUM instead.")
    return float(raw.item() if isinstance(raw, torch.Tensor) else raw)


class UnisonProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup over every rank of the unison job; see the module docstring."""

    def __init__(self, rank: int, size: int, label: str, process_set: ProcessSet = global_process_set,
                 members: Sequence[int] | None = None) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
        self._rank, self._size, self._label = rank, size, label
        self._set = process_set
        self._members = list(members) if members is not None else list(range(size))  # group rank -> global
        self._lock = threading.Lock()
        self._completer = _Completer(label)
        self._group_name = self._group_desc = ""
        self._names = CallNames()
        self._naming = threading.local()  # the call this thread named last: (index, name), for _work
        self._in_flight: dict[str, UnisonWork] = {}  # name -> the last work under it

    def __repr__(self) -> str:
        return (f"<UnisonProcessGroup {self._label} rank={self._rank} size={self._size} ranks={self._members} "
                f"calls={self._names.calls}>")

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # torch names each group after making it; a Python group keeps the name itself
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._group_desc

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def shutdown(self) -> None:
        self._completer.stop()

    def abort(self) -> None:
        self._completer.stop()

    # -- naming and completion -----------------------------------------------------------------------

    def _name(self, signature: Hashable) -> str:
        """The next call's name (`CallNames`), once the last call under that name has finished here."""
        with self._lock:
            call = self._names.calls
            name = f"torch.{self._label}.{self._names.next(signature)}"
            earlier = self._in_flight.pop(name, None)
        self._naming.last = (call, name)  # per thread: DDP's device threads and the main thread both call
        if earlier is not None:
            earlier.settle()  # only with more calls in flight than the names' window (16)
        return name

    def _work(self, what: str, handles: list[int], finish: Callable[[list[Any]], _Outputs]) -> UnisonWork:
        future: torch.futures.Future[_Outputs | _Failed] = torch.futures.Future()
        table = _runtime.job().handles
        waits = [waiter for handle in handles for waiter in table[handle][0]]
        call, name = self._naming.last
        pending = _Pending(handles, finish, future, lambda error: self._failed(call, name, error))
        work = UnisonWork(pending, what, waits, self._completer)
        with self._lock:
            self._in_flight[name] = work
            if len(self._in_flight) > 2 * MIN_WINDOW:
                self._in_flight = {n: w for n, w in self._in_flight.items() if not w.is_completed()}
        return work

    def _failed(self, call: int, name: str, error: BaseException) -> None:
        """A call failed on every rank (unison's errors are the job's): the same token in every history."""
        if isinstance(error, UnisonError):
            with self._lock:
                self._names.replace(call, ("failed", name))

    # -- reductions ----------------------------------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor],
                  opts: dist.AllreduceOptions | None = None) -> UnisonWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._allreduce(list(tensors), op, self._name(("allreduce", _sig(tensors), _op_key(op))), "allreduce")

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor],
                            opts: dist.AllreduceCoalescedOptions | None = None) -> UnisonWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._allreduce(list(tensors), op, self._name(("allreduce_coalesced", _sig(tensors), _op_key(op))), "allreduce_coalesced", grouped=True)

    def _allreduce(self, tensors: list[torch.Tensor], reduce_op: _TorchOp, name: str, what: str,
                   grouped: bool = False,
                   after: Callable[[list[torch.Tensor]], list[torch.Tensor]] = lambda tensors: tensors) -> UnisonWork:
        op, bitwise, factor = _op(reduce_op)
        if bitwise is not None:
            handles = [allgather_async(t.reshape(1, *t.shape), name=f"{name}.{i}", process_set=self._set)
                       for i, t in enumerate(tensors)]

            def finish_bitwise(results: list[torch.Tensor]) -> list[torch.Tensor]:
                for tensor, gathered in zip(tensors, results):
                    tensor.copy_(fold(bitwise, gathered.unbind(0)))
                return after(tensors)
            return self._work(what, handles, finish_bitwise)
        work_tensors, copies = _contiguous(tensors)
        if grouped or len(work_tensors) > 1:
            handles = [grouped_allreduce_async_(work_tensors, name=name, op=op, prescale_factor=factor,
                                                process_set=self._set)]
        else:
            handles = [allreduce_async_(work_tensors[0], name=name, op=op, prescale_factor=factor,
                                        process_set=self._set)]

        def finish(results: list[torch.Tensor | list[torch.Tensor]]) -> list[torch.Tensor]:
            _copy_back(copies)
            return after(tensors)
        return self._work(what, handles, finish)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: dist.ReduceOptions) -> UnisonWork:
        # an allreduce out of place, kept by the root alone: exact, at the cost of the others' copy
        name, root = self._name(("reduce", _sig(tensors), _op_key(opts.reduceOp), opts.rootRank)), opts.rootRank
        scratch = [t.detach().clone() for t in tensors]
        keep = list(tensors)
        return self._allreduce(scratch, opts.reduceOp, name, "reduce",
                               after=lambda results: _keep_at_root(results, keep, self._rank == root))

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                       opts: dist.ReduceScatterOptions | None = None) -> UnisonWork:
        if len(outputs) != 1 or len(inputs) != 1:
            raise UnisonNotImplementedError("reduce_scatter with several tensors per rank: pass one output "
                                            "and one input list.")
        pieces = list(inputs[0])
        _check_count("reduce_scatter", pieces, self._size)
        stacked = torch.stack([p.reshape(outputs[0].shape) for p in pieces])
        return self._reduce_scatter(outputs[0], stacked, opts, "reduce_scatter")

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: dist.ReduceScatterOptions | None = None) -> UnisonWork:
        if input.numel() != output.numel() * self._size:
            raise InvalidArgumentError(
                f"reduce_scatter_tensor needs an input of size * output elements ({self._size} * "
                f"{output.numel()}). Got {input.numel()}.")
        return self._reduce_scatter(output, input.reshape(self._size, *output.shape), opts,
                                    "reduce_scatter_tensor")

    reduce_scatter_single = _reduce_scatter_base

    def _reduce_scatter(self, output: torch.Tensor, stacked: torch.Tensor,
                        opts: dist.ReduceScatterOptions | None, what: str) -> UnisonWork:
        op, bitwise, factor = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if bitwise is not None:
            raise UnisonNotImplementedError(f"{what} with a bitwise op on the unison backend: use all_reduce.")
        name = self._name((what, _sig([output, stacked]), _op_key(opts.reduceOp if opts is not None else None)))
        handle = reducescatter_async(stacked.contiguous(), name=name, op=op, prescale_factor=factor,
                                     process_set=self._set)

        def finish(results: list[torch.Tensor]) -> list[torch.Tensor]:
            output.copy_(results[0].reshape(output.shape))
            return [output]
        return self._work(what, [handle], finish)

    # -- gathers ---------------------------------------------------------------------------------------

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  opts: AllgatherOptions | None = None) -> UnisonWork:
        if len(inputs) != 1 or len(outputs) != 1:
            raise UnisonNotImplementedError("allgather with several tensors per rank: pass one input.")
        targets = list(outputs[0])
        _check_count("all_gather", targets, self._size)
        source = inputs[0]
        shapes = [tuple(t.shape) for t in targets]
        if len(set(shapes)) == 1 and shapes[0] == tuple(source.shape):
            return self._gather_into(targets, source, "all_gather")
        return self._gather_uneven(targets, source)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: AllgatherOptions | None = None) -> UnisonWork:
        if output.numel() != input.numel() * self._size:
            raise InvalidArgumentError(
                f"all_gather_into_tensor needs an output of size * input elements ({self._size} * "
                f"{input.numel()}). Got {output.numel()}.")
        handle = allgather_async(input.reshape(1, *input.shape).contiguous(),
                                 name=self._name(("all_gather_into_tensor", _sig([output, input]))), process_set=self._set)

        def finish(results: list[torch.Tensor]) -> list[torch.Tensor]:
            output.copy_(results[0].reshape(output.shape))
            return [output]
        return self._work("all_gather_into_tensor", [handle], finish)

    all_gather_single = _allgather_base

    def _gather_into(self, targets: list[torch.Tensor], source: torch.Tensor, what: str) -> UnisonWork:
        handle = allgather_async(source.reshape(1, *source.shape).contiguous(),
                                 name=self._name((what, _sig([source, *targets]))), process_set=self._set)

        def finish(results: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            for target, piece in zip(targets, results[0].unbind(0)):
                target.copy_(piece)
            return [targets]
        return self._work(what, [handle], finish)

    def _gather_uneven(self, targets: list[torch.Tensor], source: torch.Tensor) -> UnisonWork:
        # every rank's tensor flattened, concatenated along dimension 0 (unison's allgather allows
        # a different length per rank), then cut by the output shapes
        handle = allgather_async(source.reshape(-1).contiguous(), name=self._name(("all_gather", _sig([source, *targets]))),
                                 process_set=self._set)

        def finish(results: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            offset = 0
            for target in targets:
                count = target.numel()
                target.copy_(results[0][offset:offset + count].reshape(target.shape))
                offset += count
            return [targets]
        return self._work("all_gather", [handle], finish)

    def gather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
               opts: dist.GatherOptions) -> UnisonWork:
        source, root = inputs[0], opts.rootRank
        targets = list(outputs[0]) if outputs else []
        if self._rank == root:
            _check_count("gather", targets, self._size)
        handle = allgather_async(source.reshape(1, *source.shape).contiguous(),
                                 name=self._name(("gather", _sig([source]), root)), process_set=self._set)

        def finish(results: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            if self._rank == root:
                for target, piece in zip(targets, results[0].unbind(0)):
                    target.copy_(piece)
            return [targets]
        return self._work("gather", [handle], finish)

    # -- broadcast, scatter, alltoall ------------------------------------------------------------------

    def broadcast(self, tensors: Sequence[torch.Tensor],
                  opts: dist.BroadcastOptions | None = None) -> UnisonWork:
        root = opts.rootRank if opts is not None else 0
        name = self._name(("broadcast", _sig(tensors), root))
        work_tensors, copies = _contiguous(list(tensors))
        handles = [broadcast_async_(t, root_rank=self._members[root], name=name if len(work_tensors) == 1 else f"{name}.{i}",
                                    process_set=self._set)  # unison's roots are global ranks, torch's the group's
                   for i, t in enumerate(work_tensors)]

        def finish(results: list[torch.Tensor]) -> list[torch.Tensor]:
            _copy_back(copies)
            return list(tensors)
        return self._work("broadcast", handles, finish)

    def scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                opts: dist.ScatterOptions) -> UnisonWork:
        output, root = outputs[0], opts.rootRank
        if self._rank == root:
            pieces = list(inputs[0])
            _check_count("scatter", pieces, self._size)
            send = torch.stack([p.reshape(output.shape) for p in pieces])
            splits = [1] * self._size
        else:
            send = output.new_empty((0, *output.shape))
            splits = [0] * self._size
        handle = alltoall_async(send.contiguous(), splits=splits, name=self._name(("scatter", _sig([output]), root)),
                                process_set=self._set)

        def finish(results: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
            received, _ = results[0]
            output.copy_(received.reshape(output.shape))
            return [output]
        return self._work("scatter", [handle], finish)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                 opts: dist.AllToAllOptions | None = None) -> UnisonWork:
        _check_count("all_to_all", list(inputs), self._size)
        _check_count("all_to_all", list(outputs), self._size)
        send = torch.cat([t.reshape(-1) for t in inputs])
        splits = [t.numel() for t in inputs]
        handle = alltoall_async(send, splits=splits, name=self._name(("all_to_all", _sig([*inputs, *outputs]))),
                                process_set=self._set)

        def finish(results: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
            received, _ = results[0]
            offset = 0
            for target in outputs:
                target.copy_(received[offset:offset + target.numel()].reshape(target.shape))
                offset += target.numel()
            return list(outputs)
        return self._work("all_to_all", [handle], finish)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                      input_split_sizes: Sequence[int],
                      opts: dist.AllToAllOptions | None = None) -> UnisonWork:
        rows = input.shape[0] if input.dim() else 1
        splits = list(input_split_sizes) or [rows // self._size] * self._size
        if not input_split_sizes and rows % self._size:
            raise InvalidArgumentError(
                f"all_to_all_single without split sizes needs dimension 0 ({rows}) divisible by the group's "
                f"size ({self._size}).")
        handle = alltoall_async(input.contiguous(), splits=splits,
                                name=self._name(("all_to_all_single", _sig([input, output]), tuple(splits))),
                                process_set=self._set)

        def finish(results: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
            received, _ = results[0]
            output.copy_(received.reshape(output.shape))
            return [output]
        return self._work("all_to_all_single", [handle], finish)

    all_to_all_single = alltoall_base

    def barrier(self, opts: dist.BarrierOptions | None = None) -> UnisonWork:
        handle = allreduce_async_(torch.zeros(1), name=self._name(("barrier",)), op=ReduceOp.SUM, process_set=self._set)
        return self._work("barrier", [handle], lambda results: [])

    # -- what unison cannot carry ------------------------------------------------------------------------

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> UnisonWork:
        raise _point_to_point("send")

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> UnisonWork:
        raise _point_to_point("recv")

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> UnisonWork:
        raise _point_to_point("recv")


def _sig(tensors: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, ...], torch.dtype, str], ...]:
    """What a call's tensors are, for `CallNames`: shape, dtype and device of each."""
    return tuple((tuple(t.shape), t.dtype, t.device.type) for t in tensors)


def _op_key(reduce_op: _TorchOp | None) -> tuple[str | float, ...]:
    if reduce_op is None:
        return ()
    kind = getattr(reduce_op, "op", reduce_op)
    return (str(kind), _op(reduce_op)[2] if kind == _RED.PREMUL_SUM else 1.0)


def _point_to_point(call: str) -> UnisonNotImplementedError:
    return UnisonNotImplementedError(
        f"dist.{call} (and isend, irecv, batch_isend_irecv) is not available on the unison backend: unison runs "
        "collectives only. Use dist.broadcast or dist.scatter from the sending rank, or a gloo group for "
        "point-to-point traffic: dist.new_group(backend='gloo')."
    )


def _check_count(call: str, tensors: Sequence[torch.Tensor], size: int) -> None:
    if len(tensors) != size:
        raise InvalidArgumentError(f"{call} needs one tensor per rank of the group ({size}). Got {len(tensors)}.")


def _contiguous(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Contiguous stand-ins for non-contiguous tensors, and the copies back to make at the end."""
    out, copies = [], []
    for tensor in tensors:
        if tensor.is_contiguous():
            out.append(tensor)
        else:
            stand_in = tensor.contiguous()
            out.append(stand_in)
            copies.append((tensor, stand_in))
    return out, copies


def _copy_back(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for tensor, stand_in in copies:
        tensor.copy_(stand_in)


def _keep_at_root(results: list[torch.Tensor], tensors: list[torch.Tensor], root: bool) -> list[torch.Tensor]:
    if root:
        for tensor, result in zip(tensors, results):
            tensor.copy_(result)
    return tensors


def create_process_group(options: _DistributedBackendOptions,
                         backend_options: object = None) -> UnisonProcessGroup:
    """torch's factory for ``"unison"`` (its extended API): start unison if needed, check the group."""
    if not _runtime.is_initialized():
        _runtime.init()
    ranks = list(getattr(options, "global_ranks_in_group", []) or [])
    size = _runtime.size()
    if ranks and ranks != list(range(size)):
        return _subset_group(ranks, options)
    group_size = int(options.group_size)
    if group_size != size or int(options.group_rank) != _runtime.rank():
        raise InvalidArgumentError(
            f"init_process_group('unison') was given rank={options.group_rank}, world_size={group_size}, but "
            f"the unison job has rank {_runtime.rank()} of {size}. Leave rank and world_size out: the unison "
            "backend takes them from the job."
        )
    _warn_timeout(getattr(options, "timeout", None))
    return UnisonProcessGroup(_runtime.rank(), size, _label(global_process_set))


def _label(process_set: ProcessSet) -> str:
    """The group's part of its calls' names: ``pg``, ``pg2``... on the whole job, ``s<set id>`` (``.2``...) on a
    set; counted per set, so that every member names a group alike whatever groups it is not in."""
    set_id = int(process_set.process_set_id or 0)
    with _group_lock:
        count = _group_count[set_id] = _group_count.get(set_id, 0) + 1
    base = "pg" if set_id == 0 else f"s{set_id}"
    return base if count == 1 else (f"pg{count}" if set_id == 0 else f"{base}.{count}")


def _subset_group(ranks: list[int], options: _DistributedBackendOptions) -> UnisonProcessGroup:
    """The group of a `dist.new_group(ranks)` on the unison process set that `_registering_sets` registered."""
    size = _runtime.size()
    process_set = registered_set_of(ranks)
    if ranks != sorted(ranks) or process_set is None:
        why = ("its ranks are not in increasing order (sort_ranks=False): a unison process set orders its "
               "members by rank" if ranks != sorted(ranks) else
               "no unison process set of those ranks was registered on every rank (new_group with "
               "use_local_synchronization=True, or a torch without the group creation unison wraps)")
        raise UnisonNotImplementedError(
            f"dist.new_group(ranks={ranks}) in a job of {size} ranks on the unison backend: {why}. Call "
            "dist.new_group(ranks) on every rank with sorted ranks, or use dist.new_group(ranks, backend='gloo') "
            "for this group.")
    _warn_timeout(getattr(options, "timeout", None))
    return UnisonProcessGroup(int(options.group_rank), len(ranks), _label(process_set), process_set, ranks)


def _warn_timeout(timeout: object) -> None:
    if not isinstance(timeout, timedelta):
        return
    settings = _runtime.job().settings
    seconds = timeout.total_seconds()
    limit = settings.stall_shutdown_seconds
    if limit and seconds < limit:
        log.warning(
            "init_process_group(timeout=%g s) is not a per-call deadline on the unison backend: unison names "
            "a rank that never issues a collective after UNISON_STALL_CHECK_TIME_SECONDS (%g s) and stops the "
            "job after UNISON_STALL_SHUTDOWN_TIME_SECONDS (%g s); a provable deadlock after "
            "UNISON_DEADLOCK_SECONDS (%g s). Set those for a shorter bound.",
            seconds, settings.stall_check_seconds, limit, settings.deadlock_seconds)



def job_store(timeout: timedelta) -> tuple[dist.Store, int, int]:
    """A torch store shared by the ranks of the unison job, with this rank and the job's size.

    Rank 0 hosts a TCPStore on a free port and the others learn its address through unison (a
    broadcast): no MASTER_ADDR or MASTER_PORT is needed. One process gets an in-memory store. When every
    rank is on rank 0's host, the store listens on the loopback interface only (torch's own server
    listens on every interface): nothing off the host can reach it.
    """
    if not _runtime.is_initialized():
        _runtime.init()
    rank, size = _runtime.rank(), _runtime.size()
    if size == 1:
        return dist.HashStore(), rank, size
    from ..._job.objects import broadcast_object

    address = None
    if rank == 0:
        if _runtime.local_size() == size:
            store, port = _loopback_store(size, timeout)
            address = ("127.0.0.1", port)
        else:
            host = socket.getfqdn()
            store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
            address = (host, store.port)
    address = broadcast_object(address, root_rank=0, name="torch.store.address")
    if rank != 0:
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=timeout)
    return store, rank, size


def _loopback_store(size: int, timeout: timedelta) -> tuple[dist.TCPStore, int]:
    """A master TCPStore that listens on 127.0.0.1 alone, on a free port: torch binds its own server to
    every interface, so the listening socket is made here and a duplicate of it handed over (torch owns
    and closes that one; a failure never closes a descriptor twice). Before torch 2.8, libuv's server
    did not listen on a socket it was given (torch PR 150215): there the classic server takes it. A
    torch without ``master_listen_fd`` gets its own server, on every interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(max(size, 128))
        port = listener.getsockname()[1]
        handed = os.dup(listener.fileno())
        try:
            if torch.__version__ < "2.8":  # a TorchVersion: compared as a version, not as text
                store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=timeout,
                                      wait_for_workers=False, master_listen_fd=handed, use_libuv=False)
            else:
                store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=timeout,
                                      wait_for_workers=False, master_listen_fd=handed)
        except TypeError:  # no master_listen_fd or use_libuv in this torch: the descriptor was never taken
            os.close(handed)
            store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
            return store, store.port
    return store, port


def _rendezvous_with_fallback(original: Callable[..., Iterator[tuple[dist.Store, int, int]]],
                              ) -> Callable[..., Iterator[tuple[dist.Store, int, int]]]:
    """torch's env:// rendezvous, unless MASTER_ADDR is unset: then the unison job's own (`job_store`).

    torch reads its launch variables from the environment itself; so does this check, for the same ones.
    """
    def handler(url: str, timeout: timedelta = timedelta(minutes=30),
                **kwargs: object) -> Iterator[tuple[dist.Store, int, int]]:
        if os.environ.get("MASTER_ADDR"):
            yield from original(url, timeout, **kwargs)
            return
        store, rank, size = job_store(timeout)
        asked = dict(part.split("=", 1) for part in url.partition("?")[2].split("&") if "=" in part)
        if int(asked.get("rank", rank)) != rank or int(asked.get("world_size", size)) != size:
            raise InvalidArgumentError(
                f"init_process_group was given rank={asked.get('rank')}, world_size={asked.get('world_size')}, "
                f"but the unison job has rank {rank} of {size}. Leave rank and world_size out under unisonrun "
                "or mpiexec: they come from the job.")
        yield (store, rank, size)
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")
    handler.unison_fallback = True  # type: ignore[attr-defined]
    return handler


def _registering_sets(original: Callable[..., _R]) -> Callable[..., _R]:
    """torch's group creation (behind ``new_group``, ``new_subgroups`` and DeviceMesh), registering the
    unison process set of a subset group's ranks on every rank first when the group is unison's.

    torch runs it on every rank for ``new_group`` (its contract), and calls the backend on the members
    only; unison registers a process set on every rank, in the same order. Calls made on the members
    alone (a tag of functional collectives, ``use_local_synchronization``) register nothing: their
    backend then says why it cannot run the group.
    """
    signature = inspect.signature(original)

    def create(*args: object, **kwargs: object) -> _R:
        call = signature.bind_partial(*args, **kwargs).arguments
        ranks, backend = call.get("ranks"), call.get("backend")
        if (ranks is not None and call.get("pg_tag") is None and _is_unison(backend)
                and sorted(ranks) != list(range(dist.get_world_size()))):
            if call.get("use_local_synchronization"):
                raise UnisonNotImplementedError(
                    f"dist.new_group(ranks={list(ranks)}, use_local_synchronization=True) on the unison backend: "
                    "unison registers a group's process set on every rank. Leave use_local_synchronization out "
                    "(every rank calls new_group), or use backend='gloo' for this group.")
            if call.get("sort_ranks", True) or list(ranks) == sorted(ranks):
                if not _runtime.is_initialized():
                    _runtime.init()
                process_set_of(sorted(int(r) for r in ranks))
        return original(*args, **kwargs)
    create.unison_sets = True  # type: ignore[attr-defined]
    return create


def _is_unison(backend: str | None) -> bool:
    """Whether a group made with `backend` (None: the default group's) runs on the unison backend."""
    if backend is None or backend == "":
        if not dist.is_initialized():
            return False
        backend = dist.get_backend()
    return BACKEND_NAME in str(backend).lower()


def register() -> None:
    """Register the ``"unison"`` backend with torch.distributed, once per process.

    Also lets env:// (the default of ``init_process_group``) find the job's ranks through unison when
    MASTER_ADDR is unset, as under unisonrun or mpiexec, and subset groups register their unison process
    sets on every rank (`_registering_sets`).
    """
    if not hasattr(dist.Backend, BACKEND_NAME.upper()):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    creator = getattr(c10d, "_new_group_with_tag", None)
    if callable(creator) and not getattr(creator, "unison_sets", False):
        c10d._new_group_with_tag = _registering_sets(creator)  # type: ignore[union-attr]
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(rendezvous, "_rendezvous_handlers", None)
    if isinstance(handlers, dict) and "env" in handlers and not getattr(handlers["env"], "unison_fallback", False):
        handlers["env"] = _rendezvous_with_fallback(handlers["env"])
