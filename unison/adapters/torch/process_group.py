"""torch.distributed's ``"unison"`` backend: a Python ProcessGroup whose collectives run through unison.

``dist.init_process_group("unison")`` (after ``import unison.torch``) makes a `UnisonProcessGroup`:
DDP, ZeroRedundancyOptimizer, FSDP2 and plain ``dist.*`` calls then go through unison's engine, so the
coordinator checks every collective before any data moves. torch's collectives carry no names; each
call here is named from the calls before it (`call_names`: ``torch.<group>.<n>``, and once the
program repeats, names that recur with it so that unison's response cache serves them), the same on
every rank that runs the same program. Two ranks at different points of their programs then ask for different
collectives, shapes or dtypes under one name, and every rank gets a `MismatchError` naming the ranks
and both calls from the work's ``wait()`` (out of DDP's ``backward()``), instead of a watchdog timeout.

Every call returns at once with a `UnisonWork` (`pg_work`). Calls that unison has no collective for are composed exactly:
``reduce`` and ``gather`` from the allreduce and allgather (the root keeps the result), ``scatter``
from an alltoall in which only the root sends, the bitwise ops from an allgather reduced locally.
Point-to-point calls raise an error that names the call.

``dist.new_group(ranks)`` of a subset runs on a unison process set of those ranks: torch calls the
backend on the group's members only, but every rank calls ``new_group`` (torch's contract), so
`register` wraps torch's group creation to register the set on every rank first (`group_creation`).

The first group's factory forms the job from what torch hands it (`unison._job.runtime.join_job`: the
store of torch's rendezvous, the rank, the world size, the timeout), unless this process is already a
rank of a unison job. torch's functional collectives (DTensor's redistribution, FSDP2's full state
dicts, distributed checkpoints) reach the group through its coalesced gathers and reduce-scatters
(``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``), which torch's own base
class would send to a per-device backend that a group written in Python has none of. The group's
collectives are kept out of torch.compile's tracing (dynamo reached them when DDP rebuilt its
buckets in a compiled model, and failed on the group object).
"""

# torch's stubs declare ProcessGroup's methods as overloads of its C++ and Python forms; a Python
# group overrides the form torch's c10d calls (tensor lists and an options object).
# mypy: disable-error-code="override,assignment"

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from datetime import timedelta
from functools import reduce as fold
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..._job import runtime as _runtime
from ..._job.launch import Request
from ..._job.objects import registered_set_of
from ..._job.submit import Call, control_call, lazily, take_call
from ...engine.where import add_origin
from ...errors import InvalidArgumentError, UnisonError, UnisonNotImplementedError
from ...ops import CollectiveKind
from ...process_sets import ProcessSet, global_process_set
from .call_names import MIN_WINDOW, CallNames
from .call_sites import Buckets, origin
from .collectives import (
    allgather_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async_,
    grouped_allreduce_async_,
    reducescatter_async,
)
from .group_creation import BACKEND_NAME, registering_sets
from .pg_ops import (
    _check_count,
    _contiguous,
    _copy_back,
    _keep_at_root,
    _op,
    _op_and_key,
    _op_key,
    _point_to_point,
    _sig,
)
from .pg_work import DoneWork, UnisonWork, _Completer, _Failed, _Pending, steady_work
from .torch_store import job_store, rendezvous_with_fallback

if TYPE_CHECKING:
    from typing import TypeAlias

    from torch._C._distributed_c10d import AllgatherOptions, _DistributedBackendOptions

    # what a call's work completes with: its output tensors (a list of them per input for the gathers)
    _Outputs: TypeAlias = list[torch.Tensor] | list[list[torch.Tensor]]
    # a torch reduce op as c10d hands it: an options object's ReduceOp, or a member such as ReduceOp.SUM
    _TorchOp: TypeAlias = dist.ReduceOp | dist.ReduceOp.RedOpType

__all__ = ["BACKEND_NAME", "UnisonProcessGroup", "UnisonWork", "create_process_group", "job_store", "register"]

log = logging.getLogger(__name__)

_group_count: dict[int, int] = {}  # process set id -> groups made on it here (the same on every member)
_group_lock = threading.Lock()
# the collectives torch calls on a group: kept out of torch.compile's tracing
_COLLECTIVES = ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
                "allgather", "_allgather_base", "gather", "broadcast", "scatter", "alltoall", "alltoall_base",
                "barrier", "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")


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
        self._names = CallNames(prefix=f"torch.{label}.")
        self._naming = threading.local()  # the call this thread named last: (index, name), for _work
        self._in_flight: dict[str, UnisonWork] = {}  # name -> the last work under it
        self.buckets = Buckets()  # DDP's bucket numbers, for the sites of calls read afresh (`call_sites`)

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
            name = self._names.next(signature)
            earlier = self._in_flight.pop(name, None)
        self._naming.last = (call, name)  # per thread: DDP's device threads and the main thread both call
        if earlier is not None:
            earlier.settle()  # only with more calls in flight than the names' window (16)
        return name

    def call_index(self) -> int:
        """The number of the call this thread named last (its sites: `call_sites`)."""
        last = getattr(self._naming, "last", None)
        return -1 if last is None else int(last[0])

    def _work(self, what: str, handles: Sequence[int | Call[Any]],
              finish: Callable[[list[Any]], _Outputs]) -> UnisonWork:
        future: torch.futures.Future[_Outputs | _Failed] = torch.futures.Future()
        # the work owns the calls from here (out of the job's table of integer handles)
        calls = [handle if isinstance(handle, Call) else take_call(handle) for handle in handles]
        waits = [waiter for call in calls for waiter in call.handles]
        index, name = self._naming.last
        pending = _Pending(calls, finish, future, lambda error: self._failed(index, name, error))
        work = UnisonWork(pending, what, waits, self._completer, _runtime.job().engine.wake)
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
                  opts: dist.AllreduceOptions | None = None) -> UnisonWork | DoneWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        resolved, key = _op_and_key(op, getattr(op, "op", op))
        name = self._name(("allreduce", _sig(tensors), key))
        if len(tensors) == 1:
            done = steady_work(tensors[0], resolved, name, self._set, self._work)
            if done is not None:
                return done
        return self._allreduce(list(tensors), op, name, "allreduce")

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

    def reduce_scatter_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> UnisonWork:
        """Several ``reduce_scatter_tensor`` in one call (torch's functional collectives come here)."""
        outputs, inputs = list(outputs), list(inputs)
        op, bitwise, factor = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if bitwise is not None:
            raise UnisonNotImplementedError("reduce_scatter_tensor with a bitwise op on the unison backend: use "
                                            "all_reduce.")
        for output, source in zip(outputs, inputs):
            if source.numel() != output.numel() * self._size:
                raise InvalidArgumentError(
                    f"reduce_scatter_tensor needs an input of size * output elements ({self._size} * "
                    f"{output.numel()}). Got {source.numel()}.")
        name = self._name(("reduce_scatter_tensor_coalesced", _sig([*outputs, *inputs]),
                           _op_key(opts.reduceOp if opts is not None else None)))
        handles = [reducescatter_async(source.reshape(self._size, *output.shape).contiguous(), name=f"{name}.{i}",
                                       op=op, prescale_factor=factor, process_set=self._set)
                   for i, (output, source) in enumerate(zip(outputs, inputs))]

        def finish(results: list[torch.Tensor]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results):
                output.copy_(result.reshape(output.shape))
            return outputs
        return self._work("reduce_scatter_tensor_coalesced", handles, finish)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

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

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: AllgatherOptions | None = None) -> UnisonWork:
        """Several ``all_gather_into_tensor`` in one call: torch's functional collectives (DTensor's
        redistribution, FSDP2's full state dicts) come here, not to the per-device backend."""
        outputs, inputs = list(outputs), list(inputs)
        for output, source in zip(outputs, inputs):
            if output.numel() != source.numel() * self._size:
                raise InvalidArgumentError(
                    f"all_gather_into_tensor needs an output of size * input elements ({self._size} * "
                    f"{source.numel()}). Got {output.numel()}.")
        name = self._name(("all_gather_into_tensor_coalesced", _sig([*outputs, *inputs])))
        handles = [allgather_async(source.reshape(1, *source.shape).contiguous(), name=f"{name}.{i}",
                                   process_set=self._set) for i, source in enumerate(inputs)]

        def finish(results: list[torch.Tensor]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results):
                output.copy_(result.reshape(output.shape))
            return outputs
        return self._work("all_gather_into_tensor_coalesced", handles, finish)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

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
        # A barrier of its own kind, not an allreduce of one zero: against another rank's allreduce of
        # one float it is a mismatch, where the allreduce would have passed with a wrong sum.
        call = control_call(CollectiveKind.BARRIER, "barrier." + self._name(("barrier",)), self._set)
        return self._work("barrier", [call], lambda results: [])

    # -- what unison cannot carry ------------------------------------------------------------------------

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> UnisonWork:
        raise _point_to_point("send")

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> UnisonWork:
        raise _point_to_point("recv")

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> UnisonWork:
        raise _point_to_point("recv")


def create_process_group(options: _DistributedBackendOptions,
                         backend_options: object = None) -> UnisonProcessGroup:
    """torch's factory for ``"unison"`` (its extended API): start unison if needed, check the group."""
    ranks = list(getattr(options, "global_ranks_in_group", []) or [])
    group_rank, group_size = int(options.group_rank), int(options.group_size)
    timeout = getattr(options, "timeout", None)
    if not _runtime.is_initialized():
        if ranks:  # a group of some ranks before the job: the job comes from the launch alone
            _runtime.init()
        else:  # init_process_group: the job from torch's rendezvous, unless a launch of unison's made one
            _runtime.join_job(Request(options.store, group_rank, group_size, timeout))
    size = _runtime.size()
    if ranks and ranks != list(range(size)):
        group = _subset_group(ranks, options)
    else:
        if group_size != size or group_rank != _runtime.rank():
            raise InvalidArgumentError(
                f"init_process_group('unison') was given rank={group_rank}, world_size={group_size}, but this "
                f"process is rank {_runtime.rank()} of {size} in its unison job ({_how_formed()}). Pass the job's "
                "rank and size, or leave rank and world_size out under unisonrun or mpiexec: the unison backend "
                "takes them from the job.")
        _warn_timeout(timeout)
        group = UnisonProcessGroup(_runtime.rank(), size, _label(global_process_set))
    return group


def _how_formed() -> str:
    launch = _runtime.job().launch
    return {"mpi": "started by unisonrun, mpiexec or srun", "torch": "formed at a torch store earlier",
            "single": "a job of this process alone"}.get(launch, "formed earlier")


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


def register() -> None:
    """Register the ``"unison"`` backend with torch.distributed, once per process.

    Also lets env:// (the default of ``init_process_group``) find the job's ranks through unison when
    MASTER_ADDR is unset, as under unisonrun or mpiexec, and subset groups register their unison process
    sets on every rank (`group_creation.registering_sets`).
    """
    add_origin(origin)  # what in torch made each call, for the sites messages name
    if not hasattr(dist.Backend, BACKEND_NAME.upper()):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    creator = getattr(c10d, "_new_group_with_tag", None)
    if callable(creator) and not getattr(creator, "unison_sets", False):
        c10d._new_group_with_tag = registering_sets(creator)  # type: ignore[union-attr]
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(rendezvous, "_rendezvous_handlers", None)
    if isinstance(handlers, dict) and "env" in handlers and not getattr(handlers["env"], "unison_fallback", False):
        handlers["env"] = rendezvous_with_fallback(handlers["env"])


def _outside_dynamo(cls: type[UnisonProcessGroup]) -> None:
    """Keep the group's collectives out of torch.compile's tracing (torch's own lazy wrapper: dynamo is
    imported at the first call, where torch's optimizers have imported it already)."""
    disable = getattr(torch, "_disable_dynamo", None)
    for name in _COLLECTIVES:
        # Every call is waited for soon (dist.all_reduce at once, DDP's through the completer): its
        # submission leaves the engine thread asleep and the wait runs the cycle (`lazily`).
        method = lazily(getattr(cls, name))
        setattr(cls, name, method if disable is None else disable(method))
    cls.reduce_scatter_single = cls._reduce_scatter_base
    cls.all_gather_single = cls._allgather_base
    cls.all_to_all_single = cls.alltoall_base
    cls.all_gather_single_coalesced = cls.allgather_into_tensor_coalesced
    cls.reduce_scatter_single_coalesced = cls.reduce_scatter_tensor_coalesced


_outside_dynamo(UnisonProcessGroup)
