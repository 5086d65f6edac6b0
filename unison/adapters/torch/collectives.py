"""Every collective on torch tensors: Horovod's signatures, zero-copy buffers, handles that yield tensors.

Each call turns its tensors into NumPy views (`buffers.to_buffer`) and submits them to the engine
through `unison._job.submit.submit`, which names the op as Horovod does (``<op>.<name>``, or
``<op>.noname.<n>`` without a name, ``<op>.noname.set<id>.<n>`` in process set <id>; grouped
members ``_<i>of<N>``). Out-of-place allreduce and broadcast write straight into a torch tensor
allocated here; gathered results are wrapped with ``torch.from_numpy``. The autograd-aware forms are in `autograd`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..._job import submit as core
from ..._job.runtime import job
from ...errors import InvalidArgumentError
from ...ops import CollectiveKind, ReduceOp
from ...process_sets import ProcessSet, global_process_set
from .buffers import check_same_device, from_result, to_buffer, wait_for_result

if TYPE_CHECKING:
    from typing import TypedDict

    from typing_extensions import Unpack

    from ...dtypes import DType

    class _SubmitOptions(TypedDict, total=False):
        """What `submit_tensors` passes on to `core.submit` besides its own arguments."""

        op: ReduceOp
        prescale: float
        postscale: float
        root_rank: int

__all__ = [
    "allgather_async", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall_async",
    "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather_async",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter_async", "reducescatter_async", "sparse_allreduce_async", "synchronize", "waited",
]

_ALLREDUCE = CollectiveKind.ALLREDUCE
_BROADCAST = CollectiveKind.BROADCAST
synchronize = core.synchronize
waited = core.waited


def submit_tensors(kind: CollectiveKind, tensors: Sequence[torch.Tensor], name: str | None,
                   process_set: ProcessSet, *, in_place: bool = False, grouped: bool = False,
                   **kw: Unpack[_SubmitOptions]) -> int:
    """Submit torch tensors; `synchronize` on the handle returns tensors (a list when grouped)."""
    return core.handle_of(submit_call(kind, tensors, name, process_set, in_place=in_place, grouped=grouped, **kw))


def submit_call(kind: CollectiveKind, tensors: Sequence[torch.Tensor], name: str | None,
                process_set: ProcessSet, *, in_place: bool = False, grouped: bool = False,
                **kw: Unpack[_SubmitOptions]) -> core.Call[torch.Tensor | list[torch.Tensor]]:
    """Submit torch tensors; the call's value is the result tensor (a list when grouped)."""
    if grouped:
        check_same_device(list(tensors))
    arrays, dtypes = [], []
    for tensor in tensors:
        array, dtype = to_buffer(tensor, in_place=in_place)
        arrays.append(array)
        dtypes.append(dtype)
    torch_outputs: list[torch.Tensor] | None = None
    outputs: list[Any] | None = None  # DeviceBuffers on a GPU: core.submit takes them as NumPy arrays
    if not in_place and kind in (_ALLREDUCE, _BROADCAST):
        torch_outputs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
        outputs = [to_buffer(o, in_place=True)[0] for o in torch_outputs]
    device = tensors[0].device.type if tensors else "cpu"
    call, _, _ = core.submit(kind, arrays, name, process_set, in_place=in_place, grouped=grouped,
                             dtypes=dtypes, outputs=outputs, device=device, **kw)
    # the engine's results: NumPy arrays, or DeviceBuffers on a GPU (told apart by duck typing)
    finish: Callable[[list[Any]], torch.Tensor | list[torch.Tensor]]
    if in_place or torch_outputs is not None:
        kept = list(tensors) if in_place else list(torch_outputs or [])

        def finish(results: list[Any]) -> torch.Tensor | list[torch.Tensor]:
            for result in results:
                if result is not None and hasattr(result, "ready"):  # a GPU result: torch's stream
                    wait_for_result(result)  # waits for unison's before anyone reads it
            return kept if grouped else kept[0]
    else:
        finish = _wrap(dtypes, grouped)
    return call.then(finish)


def _wrap(dtypes: list[DType], grouped: bool) -> Callable[[list[Any]], torch.Tensor | list[torch.Tensor]]:
    def finish(results: list[Any]) -> torch.Tensor | list[torch.Tensor]:
        tensors = [from_result(r, d) for r, d in zip(results, dtypes)]
        return tensors if grouped else tensors[0]
    return finish


def _empty_group() -> int:
    empty: list[torch.Tensor] = []
    return core.handle_of(core.Call.completed(empty))


# -- allreduce -------------------------------------------------------------------------------------


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an out-of-place allreduce of `tensor`; `synchronize(handle)` returns the new tensor."""
    return submit_tensors(_ALLREDUCE, [tensor], name, process_set, op=core.resolve_op(op, average),
                          prescale=prescale_factor, postscale=postscale_factor)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of `tensor` (must be contiguous); return a handle."""
    return submit_tensors(_ALLREDUCE, [tensor], name, process_set, op=core.resolve_op(op, average),
                          prescale=prescale_factor, postscale=postscale_factor, in_place=True)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` in place across the set and return it.

    Example:
        >>> t = torch.ones(3); hvd.allreduce_(t, op=hvd.Sum)   # doctest: +SKIP
    """
    return core.waited(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one atomic group (out of place); return a handle."""
    if not tensors:
        return _empty_group()
    return submit_tensors(_ALLREDUCE, tensors, name, process_set, grouped=True,
                          op=core.resolve_op(op, average), prescale=prescale_factor,
                          postscale=postscale_factor)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place as one group; return a handle."""
    if not tensors:
        return _empty_group()
    return submit_tensors(_ALLREDUCE, tensors, name, process_set, grouped=True, in_place=True,
                          op=core.resolve_op(op, average), prescale=prescale_factor,
                          postscale=postscale_factor)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors in place as one group; return them."""
    return core.waited(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: ReduceOp | None,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """Start summing (or averaging) a sparse COO tensor with two allgathers; return a function that
    waits and returns the reduced sparse tensor.

    The tensor is coalesced locally first, so duplicate indices never travel. Indices travel transposed
    (``<name>.indices``) so that the allgather concatenates along the non-zero dimension.
    """
    resolved = core.resolve_op(op, None)
    if resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise InvalidArgumentError(
            f"sparse_allreduce_async supports op=Average or op=Sum. Got op={resolved.name}."
        )
    local = tensor.coalesce()
    indices = submit_tensors(CollectiveKind.ALLGATHER, [local.indices().t().contiguous()],
                             f"{name}.indices", process_set)
    values = submit_tensors(CollectiveKind.ALLGATHER, [local.values().contiguous()], f"{name}.values",
                            process_set)
    members = core.set_size(process_set)

    def wait() -> torch.Tensor:
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if resolved is ReduceOp.AVERAGE:
            gathered_values = gathered_values / members
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, local.size())

    return wait


# -- allgather, broadcast, alltoall, reducescatter -------------------------------------------------


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's `tensor` along dimension 0; return a handle."""
    return submit_tensors(CollectiveKind.ALLGATHER, [tensor], name, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start gathering a list of tensors as one group; return a handle."""
    if not tensors:
        return _empty_group()
    return submit_tensors(CollectiveKind.ALLGATHER, tensors, name, process_set, grouped=True)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an out-of-place broadcast from global rank `root_rank`; return a handle."""
    return submit_tensors(_BROADCAST, [tensor], name, process_set, root_rank=int(root_rank))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting `tensor` in place with `root_rank`'s; return a handle."""
    return submit_tensors(_BROADCAST, [tensor], name, process_set, root_rank=int(root_rank),
                          in_place=True)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` in place with global rank `root_rank`'s and return it."""
    return core.waited(broadcast_async_, tensor, root_rank, name, process_set)


def _splits_array(splits: torch.Tensor | Sequence[int] | None) -> np.ndarray | None:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
            raise InvalidArgumentError(
                f"alltoall expects splits to contain 32-bit integer elements. Got {splits.dtype}."
            )
        return splits.detach().cpu().numpy()
    return np.asarray(splits)


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
                   name: str | None = None, process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; `synchronize` returns ``(output, received_splits)`` (int32 tensor)."""
    current = job()
    _, members = core.member_set(current, process_set, "Alltoall")
    array, dtype = to_buffer(tensor, in_place=False)
    array, split_tuple = core.check_splits(current, array, _splits_array(splits), members)
    call, _, _ = core.submit(CollectiveKind.ALLTOALL, [array], name, process_set, splits=split_tuple,
                             dtypes=[dtype], device=tensor.device.type)

    def finish(results: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = results[0]
        return from_result(output, dtype), torch.from_numpy(np.asarray(received, dtype=np.int32))

    return core.handle_of(call.then(finish))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp | None = ReduceOp.AVERAGE,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; `synchronize` returns this rank's slice of the reduced tensor."""
    return submit_tensors(CollectiveKind.REDUCESCATTER, [tensor], name, process_set,
                          op=core.reducescatter_op(op), prescale=prescale_factor,
                          postscale=postscale_factor)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp | None = ReduceOp.AVERAGE,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of a list of tensors as one group; return a handle."""
    if not tensors:
        return _empty_group()
    return submit_tensors(CollectiveKind.REDUCESCATTER, tensors, name, process_set, grouped=True,
                          op=core.reducescatter_op(op), prescale=prescale_factor,
                          postscale=postscale_factor)
