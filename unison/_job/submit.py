"""The submit path every API shares: checks, op naming, and the submission of NumPy buffers to the engine.

The public NumPy API (`unison._job.collectives`) and the framework adapters (torch, TensorFlow, Keras)
call these; users never do. A collective becomes one `Request` per buffer, named ``<kind>.<name>`` (or
``<kind>.noname.<n>``, ``<kind>.noname.set<id>.<n>`` in process set <id>), handed to the engine as one
atomic group; the submission returns a `Call` (`unison._job.calls`), which every API waits on or
continues with `Call.then`. Horovod's integer handles index the job's table of calls (`handle_of`),
which `poll`, `synchronize` and `release` read.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from ..dtypes import DType, check_supported, dtype_of
from ..engine.adasum import is_power_of_two
from ..engine.handles import Entry, Handle
from ..engine.where import call_site
from ..errors import HorovodInternalError, InvalidArgumentError, UnisonNotImplementedError
from ..ops import CollectiveKind, ReduceOp
from ..process_sets import ProcessSet, global_process_set
from ..protocol.messages import Request
from . import runtime as _runtime
from .calls import Call
from .runtime import Job, job

__all__ = [
    "Call", "check_adasum", "check_splits", "control", "control_call", "handle_of", "lazily", "member_set", "poll", "reducescatter_op",
    "release", "resolve_op", "set_rank", "set_size", "steady_allreduce", "steady_request", "submit", "synchronize", "take_call",
    "waited",
]

# .waits: the submission under way is a blocking call's (see `waited`); .lazy: its caller or a thread of
# its own waits for it soon (`lazily`): either way the wait runs the cycle, and the engine thread is left asleep
_calling = threading.local()
_KEPT_REQUESTS = 4096  # requests kept for reuse per job (the table is dropped past it)
T = TypeVar("T")


def _calls() -> dict[int, Call[Any]]:
    """The running job's table of calls behind Horovod's integer handles; an empty one after shutdown."""
    current = _runtime._job
    return current.handles if current is not None else {}


def resolve_op(op: Any, average: Any) -> ReduceOp:
    """Apply Horovod's rules for the deprecated ``average=`` argument; default Average."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed.",
                      DeprecationWarning, stacklevel=3)
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return ReduceOp.AVERAGE
    try:
        resolved = ReduceOp(int(op))
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"op must be one of Average, Sum, Adasum, Min, Max, Product. Got op={op!r}."
        ) from None
    return resolved


def check_adasum(set_id: int, members: Sequence[int], dtypes: Sequence[DType]) -> None:
    """Adasum's limits, with Horovod's errors: the global set, a power-of-two size, floating point."""
    if set_id != 0:
        raise UnisonNotImplementedError("Adasum does not support non-global process sets yet.")
    if not is_power_of_two(len(members)):
        raise UnisonNotImplementedError(
            f"Running Adasum with non-power of 2 ranks is not supported yet. Got {len(members)} ranks; "
            "run on 1, 2, 4, 8, ... ranks or use op=Average."
        )
    for dtype in dtypes:
        if not dtype.is_float:
            raise InvalidArgumentError(
                f"Adasum combines floating-point tensors (float16, bfloat16, float32, float64). "
                f"Got {dtype.value}; use op=Sum for integers."
            )


def member_set(current: Job, process_set: ProcessSet, what: str) -> tuple[int, tuple[int, ...]]:
    """(set id, members) of a registered set this rank belongs to, or the Horovod-worded error."""
    set_id = process_set.process_set_id
    members = current.set_members(set_id) if set_id is not None else None
    if set_id is None or members is None:
        raise InvalidArgumentError(
            f"{what}: Process set provided does not exist, or has not been registered."
        )
    if current.rank not in members:
        raise InvalidArgumentError(
            f"{what}: Rank {current.rank} is not a member of the provided process set "
            f"(ranks {list(members)})."
        )
    return set_id, members


def set_size(process_set: ProcessSet) -> int:
    """Number of ranks in a process set: the job's size for the global set or an unknown id."""
    current = job()
    members = current.set_members(process_set.process_set_id or 0)
    return current.size if members is None else len(members)


def set_rank(process_set: ProcessSet) -> int:
    """This process's rank inside a process set (its global rank where it is not a member)."""
    current = job()
    members = current.set_members(process_set.process_set_id or 0)
    if members is None or current.rank not in members:
        return current.rank
    return list(members).index(current.rank)


def _storage(array: Any, *, in_place: bool) -> tuple[np.ndarray, DType]:
    """Return (buffer in storage dtype, dtype); in-place ops need a writable contiguous array."""
    if in_place:
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(
                f"In-place operations need a NumPy array. Got {type(array).__name__}."
            )
        if not array.flags.c_contiguous:
            raise InvalidArgumentError("Tensor is required to be contiguous.")
        if not array.flags.writeable:
            raise InvalidArgumentError("In-place operations need a writable array.")
    else:
        # np.ascontiguousarray would turn a 0-d array into shape (1,); asarray keeps it (and 0-d
        # arrays are always contiguous).
        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    dtype = dtype_of(array)
    return (array.view(np.uint16) if dtype is DType.BFLOAT16 else array), dtype


def handle_of(call: Call[Any]) -> int:
    """Horovod's integer handle for `call`: a new id (per job) in the job's table of calls."""
    current = job()
    current.handle_counter += 1
    current.handles[current.handle_counter] = call
    return current.handle_counter


def _op_name(current: Job, kind: str, name: str | None, set_id: int) -> str:
    """``<kind>.<name>``, or ``<kind>.noname.<n>`` where n counts this rank's unnamed calls in the set
    (``<kind>.noname.set<id>.<n>`` in a process set other than the global one).

    The set's id is in the name so that unnamed calls of different sets never share a name: the
    even ranks' first unnamed allreduce in their set and the odd ranks' first one in the global set
    are different collectives, which one name would have paired (and refused as a mismatch).

    Horovod numbers unnamed ops with its handle counter, which every call advances; then a rank that
    made one extra *named* call (a zero-filled missing gradient, uneven data before join) can never
    match its later unnamed ops again. Counting only unnamed calls, per process set, avoids that.

    The count pairs the n-th unnamed call of one rank with the n-th of every other, which is only
    right when each rank makes its unnamed calls in one program order: from one thread. Calls from a
    second thread would interleave differently on each rank and pair one thread's tensor with the
    other's, so they are refused (`UnnamedThreadError`). A number is used up even when the call then
    fails on this rank, so a rank that skipped a collective is caught by the coordinator as out of
    step (`unison.protocol.names.unnamed_drift`) instead of silently pairing its next call with the skipped one.
    """
    if name is not None:
        return f"{kind}.{name}"
    current.check_unnamed_thread(kind)
    index = current.next_name_index(("noname", set_id))
    return f"{kind}.noname.{index}" if set_id == 0 else f"{kind}.noname.set{set_id}.{index}"


def submit(
    kind: CollectiveKind,
    arrays: Sequence[Any],
    name: str | None,
    process_set: ProcessSet,
    *,
    op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root_rank: int = -1,
    in_place: bool = False,
    splits: Sequence[int] = (),
    grouped: bool = False,
    dtypes: Sequence[DType] | None = None,
    outputs: Sequence[np.ndarray] | None = None,
    device: str = "cpu",
) -> tuple[Call[list[Any]], list[np.ndarray], list[DType]]:
    """Submit one collective (or one atomic group) on NumPy buffers; return (its call, arrays, dtypes).

    This is the entry point the framework adapters share. By default each array's dtype is inferred
    and buffers are made contiguous. An adapter that already holds storage buffers (for example a
    torch bfloat16 tensor viewed as uint16 bits) passes ``dtypes`` to say what they hold, and may
    pass ``outputs`` (allreduce and broadcast only) so results land directly in framework memory.
    The call's value is the list of raw results, one per array; `Call.then` makes what the caller
    returns of them.
    """
    current = job()
    what = kind.value.capitalize()
    set_id, members = member_set(current, process_set, what)
    base = _op_name(current, ("grouped_" if grouped else "") + kind.value, name, set_id)
    if kind is CollectiveKind.BROADCAST and root_rank not in members:
        raise InvalidArgumentError(
            f"broadcast received invalid root rank {root_rank} for provided process set: root_rank "
            f"must be one of the set's global ranks {list(members)}."
        )
    entries: list[Entry] = []
    originals: list[np.ndarray] = []
    resolved: list[DType] = []
    count = len(arrays)
    for index, array in enumerate(arrays):
        if dtypes is None:
            buf, dtype = _storage(array, in_place=in_place)
        else:
            buf, dtype = array, dtypes[index]
            if not buf.flags.c_contiguous:
                raise InvalidArgumentError("Tensor is required to be contiguous.")
        check_supported(kind, dtype)
        if kind is CollectiveKind.ALLREDUCE and op is ReduceOp.ADASUM:
            check_adasum(set_id, members, [dtype])
        tensor_name = f"{base}_{index + 1}of{count}" if grouped else base
        request = _request(current, tensor_name, kind, dtype, tuple(buf.shape), op, root_rank, prescale,
                           postscale, set_id, device, base if grouped else "", count if grouped else 0, splits)
        if kind in (CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST):
            if in_place:
                output = buf
            elif outputs is not None:
                output = outputs[index]
            else:
                output = np.empty_like(buf)
        else:
            output = None
        entries.append(Entry(request, buf, output, Handle(tensor_name, current.engine.drive)))
        originals.append(array)
        resolved.append(dtype)
    waits = getattr(_calling, "waits", False)
    lazy = waits or getattr(_calling, "lazy", False)
    if lazy and count == 1:
        if (kind is CollectiveKind.ALLREDUCE and name is not None and (dtypes is None or in_place)
                and outputs is None and device == "cpu" and not grouped and not resolved[0].is_half
                and op is not ReduceOp.ADASUM):
            # the steady state's NumPy allreduce, when it recurs with these arguments (`steady_allreduce`)
            assert entries[0].input is not None
            key = (name, op, prescale, postscale, set_id, entries[0].input.dtype, entries[0].request.shape, in_place)
            if len(current.steady) >= _KEPT_REQUESTS:
                current.steady.clear()
            current.steady[key] = entries[0].request
        if waits and current.engine.run_now(entries[0]):
            return Call([entries[0].handle], list), originals, resolved
    current.engine.enqueue(entries, waits=lazy)
    return Call([entry.handle for entry in entries], list), originals, resolved


def lazily(start: Callable[..., T]) -> Callable[..., T]:
    """Wrap a function whose submissions are waited for soon, by its caller or by a thread of its own
    (the torch process group's calls: ``dist.all_reduce`` waits at once, DDP's hooks through the group's
    completer): they do not wake the engine thread, and the wait runs their cycle instead. A call
    nobody waits for still runs at the engine thread's next idle cycle."""
    @functools.wraps(start)
    def call(*args: Any, **kwargs: Any) -> T:
        _calling.lazy = True
        try:
            return start(*args, **kwargs)
        finally:
            _calling.lazy = False
    return call


def take_call(handle: int) -> Call[Any]:
    """The call behind Horovod's integer `handle`, out of the job's table (its new owner waits on it)."""
    return _call_of(handle, forget=True)


def steady_allreduce(tensor: np.ndarray, name: str, op: ReduceOp, prescale: float, postscale: float,
                     process_set: ProcessSet, in_place: bool) -> np.ndarray | None:
    """A blocking NumPy allreduce that recurs with the same arguments, in the steady state: no entry, no
    handle, no call, its cycle on this thread (`unison.engine.loop.Engine.run_steady`). None, having
    sent nothing, when the call is new or the engine is busy: the caller then submits it as usual.

    `op` is already resolved (Average for None). The first call with these arguments went through
    `submit`, which checked them and registered them here (``Job.steady``).
    """
    current = _runtime._job
    request = steady_request(current, tensor, name, op, prescale, postscale, process_set, in_place)
    if current is None or request is None:
        return None
    output = tensor if in_place else np.empty(tensor.shape, tensor.dtype)  # C-contiguous, as steady_request asks
    started = current.engine.run_steady(request, tensor, output)
    if started is False:
        return None
    if started is not True:
        Call([started.handle], list).result()  # its cycle became a whole one: wait like any call
    return output


def _request(current: Job, name: str, kind: CollectiveKind, dtype: DType, shape: tuple[int, ...], op: ReduceOp,
             root_rank: int, prescale: float, postscale: float, set_id: int, device: str, group: str,
             group_size: int, splits: Sequence[int]) -> Request:
    """The request of one tensor, made once per job and reused while the same call recurs (a training
    loop's gradients, a metric): a request is immutable, and one made afresh costs as much as the rest of
    a submission. Unnamed calls, whose names never recur, are made each time."""
    key = (name, kind.value, dtype.value, shape, int(op), root_rank, prescale, postscale, set_id, device, group,
           group_size, tuple(splits))
    kept = current.requests.get(key)
    if kept is not None:
        return kept
    # Made afresh: a first call or a changed one, which goes to the coordinator: where it comes from is
    # read now (for its messages), never for a request reused below.
    request = Request(name, kind, current.rank, dtype, shape, op, root_rank, float(prescale), float(postscale),
                      set_id, device, group=group, group_size=group_size, splits=tuple(int(s) for s in splits),
                      site=call_site(kind.value))
    if ".noname." not in name:
        if len(current.requests) >= _KEPT_REQUESTS:
            current.requests.clear()
        current.requests[key] = request
    return request


def steady_request(current: Job | None, tensor: np.ndarray, name: str, op: ReduceOp, prescale: float,
                   postscale: float, process_set: ProcessSet, in_place: bool) -> Request | None:
    """The request of a blocking host allreduce that recurs with these arguments (``Job.steady``), or
    None for a call not seen before, a buffer it cannot run on, or no job."""
    if current is None or not tensor.flags.c_contiguous or (in_place and not tensor.flags.writeable):
        return None
    try:
        return current.steady.get((name, op, prescale, postscale, process_set.process_set_id, tensor.dtype,
                                   tensor.shape, in_place))
    except TypeError:  # an argument that cannot be a key (unhashable): `submit` says what is wrong with it
        return None


def waited(start: Callable[..., Call[Any] | int], *args: Any, **kwargs: Any) -> Any:
    """Make a blocking call of an asynchronous one: ``synchronize(start(*args, **kwargs))``, with the
    submission marked as waited for at once, so that the wait runs the job's cycle on this thread
    instead of handing it to the engine thread and back (`unison.engine.loop.Engine.drive`)."""
    _calling.waits = True
    try:
        started = start(*args, **kwargs)
    finally:
        _calling.waits = False
    return started.result() if isinstance(started, Call) else synchronize(started)


def _call_of(handle: int | Call[Any], forget: bool) -> Call[Any]:
    if isinstance(handle, Call):
        return handle
    table = _calls()
    call = table.pop(handle, None) if forget else table.get(handle)
    if call is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return call


def poll(handle: int | Call[Any]) -> bool:
    """Return True when the asynchronous operation behind `handle` has finished.

    Example:
        >>> h = allreduce_async(np.ones(3))      # doctest: +SKIP
        >>> while not poll(h): pass              # doctest: +SKIP
    """
    return _call_of(handle, forget=False).done()


def synchronize(handle: int | Call[Any]) -> Any:
    """Wait for the operation behind `handle` (Horovod's integer handle, or a `Call`) and return its
    output (a tuple for alltoall).

    Raises:
        HorovodInternalError: the collective failed on every rank (mismatch, shutdown, stall); the
            engine's error, with the cause behind it where it had one.
    """
    call = _call_of(handle, forget=False)
    call.wait()
    if not isinstance(handle, Call):
        _calls().pop(handle, None)
    return call.result()


def release(handle: int, timeout_seconds: float) -> bool:
    """Forget `handle` after waiting at most `timeout_seconds` for it; True if it finished in time.

    Its result or error is dropped: for a caller that is leaving (``shutdown()``) and only must not
    leave before its peers got what the operation sends them.
    """
    call = _calls().pop(handle, None)
    return call is not None and call.wait(timeout_seconds)


def _first_rows(tensor: Any, count: int) -> Any:
    """The first `count` rows of a host array, a device array, or a `DeviceBuffer` (same event)."""
    if hasattr(tensor, "ready") and hasattr(tensor, "array"):
        import dataclasses

        return dataclasses.replace(tensor, array=tensor.array[:count])
    return tensor[:count] if hasattr(tensor, "shape") else np.asarray(tensor)[:count]


def check_splits(current: Job, tensor: Any, splits: Any, members: Sequence[int]) -> tuple[Any, tuple[int, ...]]:
    """Check alltoall `splits` against `tensor`'s first dimension; returns (the rows sent, the splits).

    Reads only the shape, so host arrays, GPU arrays and `DeviceBuffer`s are checked alike (rows past
    the splits' sum are not sent).
    """
    shape = tuple(tensor.shape) if hasattr(tensor, "shape") else np.shape(tensor)
    dim0 = shape[0] if shape else 0
    if splits is None:
        if shape and dim0 % len(members):
            raise InvalidArgumentError(
                "splits not provided, but first dimension of tensor is not an even multiple of the "
                f"number of workers ({dim0} rows, {len(members)} ranks)."
            )
        return tensor, ()
    values = np.asarray(splits)
    if values.ndim != 1:
        raise InvalidArgumentError("alltoall expects a 1D splits tensor")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise InvalidArgumentError(
            f"alltoall expects splits to contain integer elements. Got dtype {values.dtype}."
        )
    if values.size != len(members):
        raise InvalidArgumentError(
            f"Number of entries in splits does not equal number of workers ({values.size} != "
            f"{len(members)})."
        )
    if (values < 0).any():
        raise InvalidArgumentError(f"alltoall splits must be non-negative. Got {values.tolist()}.")
    total = int(values.sum())
    if total > dim0:
        raise InvalidArgumentError(
            f"Sum of splits entries is greater than the first dimension of tensor ({total} > {dim0})."
        )
    if total < dim0:
        tensor = _first_rows(tensor, total)
    return tensor, tuple(int(v) for v in values)


def reducescatter_op(op: Any) -> ReduceOp:
    resolved = ReduceOp.AVERAGE if op is None else resolve_op(op, None)
    if resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise HorovodInternalError(
            f"Reducescatter currently only supports AVERAGE and SUM. Got op={resolved.name}."
        )
    return resolved


def control(kind: CollectiveKind, name: str, process_set: ProcessSet = global_process_set,
             ranks: Sequence[int] = (), target_set: int | None = None) -> Any:
    """Run a call that carries no tensor (a barrier, a join, a process set's change) and return its result."""
    return control_call(kind, name, process_set, ranks, target_set, waits=True).result()


def control_call(kind: CollectiveKind, name: str, process_set: ProcessSet = global_process_set,
                 ranks: Sequence[int] = (), target_set: int | None = None, waits: bool = False) -> Call[Any]:
    """Submit a call that carries no tensor; `waits`: the caller waits for it at once (`waited`). Like
    `submit`, a call waited for soon (`lazily`) leaves the engine thread asleep: its wait runs the cycle."""
    current = job()
    set_id, _ = member_set(current, process_set, kind.value.capitalize())
    request = Request(name, kind, current.rank, process_set_id=set_id if target_set is None else target_set,
                      ranks=tuple(ranks), site=call_site(kind.value))
    entry = Entry(request, None, None, Handle(name, current.engine.drive))
    current.engine.enqueue([entry], waits=waits or getattr(_calling, "lazy", False))
    return Call([entry.handle], lambda results: results[0])
