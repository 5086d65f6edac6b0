"""The public collectives on NumPy arrays: the blocking, async and in-place forms (the submit path is `_submit`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ops import CollectiveKind, ReduceOp
from ..process_sets import ProcessSet, global_process_set
from .runtime import job
from .submit import (
    Call,
    check_splits,
    control,
    handle_of,
    member_set,
    poll,
    reducescatter_op,
    resolve_op,
    steady_allreduce,
    submit,
    synchronize,
    waited,
)

__all__ = [
    "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll", "reducescatter",
    "reducescatter_async", "synchronize",
]

def _restore(result: np.ndarray, dtype: DType, like: Any) -> np.ndarray:
    """Give a raw result the caller's dtype back (bfloat16 travels as uint16 bits)."""
    if dtype is DType.BFLOAT16:
        return result.view(like.dtype)
    return result


def _on_gpu(arrays: Sequence[Any]) -> bool:
    """Whether these are GPU arrays (CuPy, or anything with ``__cuda_array_interface__``)."""
    return any(hasattr(a, "__cuda_array_interface__") for a in arrays)


def _device(kind: CollectiveKind, arrays: Sequence[Any], name: str | None, process_set: ProcessSet,
            grouped: bool, **kw: Any) -> int:
    """Submit GPU arrays to the GPU data plane (`unison.gpu`); results are arrays of the same kind."""
    from ..gpu.handoff import device_results, prepare_arrays

    in_place = bool(kw.get("in_place"))
    buffers, dtypes, outputs = prepare_arrays(
        arrays, in_place=in_place,
        with_outputs=not in_place and kind in (CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST))
    call, _, _ = submit(kind, buffers, name, process_set, grouped=grouped, dtypes=dtypes, outputs=outputs,
                        device="cuda", **kw)
    originals = list(arrays)

    def finish(results: list[Any]) -> Any:
        made = device_results(results)
        out = originals if in_place else made
        return out if grouped else out[0]

    return handle_of(call.then(finish))


def _one(kind: CollectiveKind, array: Any, name: str | None, process_set: ProcessSet,
         **kw: Any) -> int:
    if _on_gpu([array]):
        return _device(kind, [array], name, process_set, False, **kw)
    call, originals, dtypes = submit(kind, [array], name, process_set, **kw)
    like, dtype = originals[0], dtypes[0]
    if kw.get("in_place"):
        return handle_of(call.then(lambda results: like))
    return handle_of(call.then(lambda results: _restore(results[0], dtype, like)))


def _many(kind: CollectiveKind, arrays: Sequence[Any], name: str | None, process_set: ProcessSet,
          **kw: Any) -> int:
    if not arrays:
        empty: list[np.ndarray] = []
        return handle_of(Call.completed(empty))
    if _on_gpu(arrays):
        return _device(kind, arrays, name, process_set, True, **kw)
    call, originals, dtypes = submit(kind, list(arrays), name, process_set, grouped=True, **kw)
    if kw.get("in_place"):
        return handle_of(call.then(lambda results: list(originals)))
    return handle_of(call.then(lambda results: [_restore(r, d, o) for r, d, o in zip(results, dtypes, originals)]))


# -- allreduce -------------------------------------------------------------------------------------


def allreduce_async(tensor: Any, average: Any = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` across the set's ranks; return a handle for `synchronize`."""
    return _one(CollectiveKind.ALLREDUCE, tensor, name, process_set, op=resolve_op(op, average),
                prescale=prescale_factor, postscale=postscale_factor)


def allreduce(tensor: Any, average: Any = None, name: str | None = None, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce `tensor` across the set's ranks and return the result (default op: Average).

    The result is ``postscale_factor * reduce(prescale_factor * tensor)``; Average divides by the
    set's size.

    Example:
        >>> import unison as hvd                      # doctest: +SKIP
        >>> hvd.allreduce(np.array([1.0, 2.0]), op=hvd.Sum)   # doctest: +SKIP
        array([2., 4.])                               # on 2 ranks
    """
    if name is not None and average is None and type(tensor) is np.ndarray:
        done = steady_allreduce(tensor, name, ReduceOp.AVERAGE if op is None else op, prescale_factor,
                                postscale_factor, process_set, False)
        if done is not None:
            return done
    return waited(allreduce_async, tensor, average, name, op, prescale_factor, postscale_factor,
                                       process_set)


def allreduce_async_(tensor: np.ndarray, average: Any = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` in place; return a handle."""
    return _one(CollectiveKind.ALLREDUCE, tensor, name, process_set, op=resolve_op(op, average),
                prescale=prescale_factor, postscale=postscale_factor, in_place=True)


def allreduce_(tensor: np.ndarray, average: Any = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce `tensor` in place and return it."""
    if name is not None and average is None and type(tensor) is np.ndarray:
        done = steady_allreduce(tensor, name, ReduceOp.AVERAGE if op is None else op, prescale_factor,
                                postscale_factor, process_set, True)
        if done is not None:
            return done
    return waited(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set)


def grouped_allreduce_async(tensors: Sequence[Any], average: Any = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one atomic group; return a handle."""
    return _many(CollectiveKind.ALLREDUCE, tensors, name, process_set, op=resolve_op(op, average),
                 prescale=prescale_factor, postscale=postscale_factor)


def grouped_allreduce(tensors: Sequence[Any], average: Any = None, name: str | None = None,
                      op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Reduce a list of tensors as one group (fused together); return the list of results."""
    return waited(grouped_allreduce_async, tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[np.ndarray], average: Any = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place as one group; return a handle."""
    return _many(CollectiveKind.ALLREDUCE, tensors, name, process_set, op=resolve_op(op, average),
                 prescale=prescale_factor, postscale=postscale_factor, in_place=True)


def grouped_allreduce_(tensors: Sequence[np.ndarray], average: Any = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Reduce a list of tensors in place as one group; return them."""
    return waited(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set)


# -- allgather -------------------------------------------------------------------------------------


def allgather_async(tensor: Any, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's `tensor` along dimension 0; return a handle."""
    return _one(CollectiveKind.ALLGATHER, tensor, name, process_set)


def allgather(tensor: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's `tensor` along dimension 0 (first dimensions may differ).

    Example:
        >>> hvd.allgather(np.full((hvd.rank() + 1, 2), hvd.rank()))   # doctest: +SKIP
    """
    return waited(allgather_async, tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start gathering a list of tensors as one group; return a handle."""
    return _many(CollectiveKind.ALLGATHER, tensors, name, process_set)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Gather a list of tensors as one group; return the list of results."""
    return waited(grouped_allgather_async, tensors, name, process_set)


# -- broadcast -------------------------------------------------------------------------------------


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start copying `root_rank`'s tensor to every rank of the set; return a handle."""
    return _one(CollectiveKind.BROADCAST, tensor, name, process_set, root_rank=int(root_rank))


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Return `root_rank`'s `tensor` on every rank (root_rank is a global rank)."""
    return waited(broadcast_async, tensor, root_rank, name, process_set)


def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting `tensor` in place with `root_rank`'s; return a handle."""
    return _one(CollectiveKind.BROADCAST, tensor, name, process_set, root_rank=int(root_rank),
                in_place=True)


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Overwrite `tensor` in place with `root_rank`'s and return it."""
    return waited(broadcast_async_, tensor, root_rank, name, process_set)


# -- alltoall --------------------------------------------------------------------------------------


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; `synchronize` returns (output, received_splits)."""
    current = job()
    _, members = member_set(current, process_set, "Alltoall")
    if _on_gpu([tensor]):
        from ..gpu.handoff import device_results, prepare_arrays

        buffers, device_dtypes, _ = prepare_arrays([tensor], in_place=False, with_outputs=False)
        buffer, split_tuple = check_splits(current, buffers[0], splits, members)
        on_device, _, _ = submit(CollectiveKind.ALLTOALL, [buffer], name, process_set, splits=split_tuple,
                                 dtypes=device_dtypes, device="cuda")
        return handle_of(on_device.then(lambda results: (device_results([results[0][0]])[0], results[0][1])))
    tensor, split_tuple = check_splits(current, tensor, splits, members)
    call, originals, dtypes = submit(CollectiveKind.ALLTOALL, [tensor], name, process_set, splits=split_tuple)
    like, dtype = originals[0], dtypes[0]
    return handle_of(call.then(lambda results: (_restore(results[0][0], dtype, like), results[0][1])))


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send dim-0 slices of `tensor` to each rank (per `splits`, default equal) and gather theirs.

    Returns the output, or ``(output, received_splits)`` when `splits` is given.
    """
    output, received = waited(alltoall_async, tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# -- reducescatter ---------------------------------------------------------------------------------


def reducescatter_async(tensor: Any, name: str | None = None, op: Any = ReduceOp.AVERAGE,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; return a handle."""
    return _one(CollectiveKind.REDUCESCATTER, tensor, name, process_set, op=reducescatter_op(op),
                prescale=prescale_factor, postscale=postscale_factor)


def reducescatter(tensor: Any, name: str | None = None, op: Any = ReduceOp.AVERAGE,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce `tensor` across ranks and return this rank's dim-0 slice of the result.

    When dim 0 is not divisible by the set size, the first ``dim0 % size`` ranks get one extra row.
    """
    return waited(reducescatter_async, tensor, name, op, process_set, prescale_factor,
                                           postscale_factor)


def grouped_reducescatter_async(tensors: Sequence[Any], name: str | None = None,
                                op: Any = ReduceOp.AVERAGE,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of a list of tensors as one group; return a handle."""
    return _many(CollectiveKind.REDUCESCATTER, tensors, name, process_set, op=reducescatter_op(op),
                 prescale=prescale_factor, postscale=postscale_factor)


def grouped_reducescatter(tensors: Sequence[Any], name: str | None = None, op: Any = ReduceOp.AVERAGE,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    """Reducescatter a list of tensors as one group; return the list of slices."""
    return waited(grouped_reducescatter_async, tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor)


# -- join and barrier ------------------------------------------------------------------------------


def join() -> int:
    """Declare that this rank has no more data; block until every rank has joined.

    Until then, this rank contributes zeros to the other ranks' allreduces (Average still divides
    by the full set size, as in Horovod). Returns the rank that joined last, the same on every rank.
    """
    return int(control(CollectiveKind.JOIN, "join.noname"))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set has called `barrier`.

    Barriers of different sets may run at the same time (the even ranks in one, the odd in another):
    each set's barrier has its own name, ``barrier.noname.set<id>``, so they are never paired with
    each other. The name carries no call number, since a rank waits in at most one barrier per set.
    """
    set_id = process_set.process_set_id
    control(CollectiveKind.BARRIER, f"barrier.noname.set{set_id}", process_set)
