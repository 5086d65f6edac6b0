"""The blocking, autograd-aware torch collectives, with Horovod's backward rules.

Backward rules (as Horovod defines them): allreduce -> allreduce of the gradient with the same op and
scale factors; allgather -> Average-allreduce of the gradient, then this rank's rows; broadcast ->
Average-allreduce of the gradient, zero on non-root ranks; alltoall -> alltoall of the gradient with
the received splits; reducescatter -> allgather of the gradient (times the set size for Sum, times the
scale factors). Backward collectives are unnamed, so every rank must run backward in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from ..._job import submit as core
from ..._job.runtime import job
from ..._job.submit import set_rank, set_size
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from . import collectives as c
from .compression import Compression, Compressor

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "grouped_allgather", "grouped_allreduce",
           "grouped_reducescatter", "reducescatter"]


# `ctx` is Any: forward keeps what backward needs in attributes that torch's FunctionCtx does not declare.
class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                postscale: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, process_set)
        return c.waited(c.allreduce_async, tensor, None, name, op, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, pre, post, ps = ctx.args
        reduced = c.waited(c.allreduce_async, grad, None, None, op, pre, post, ps)
        return reduced, None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(c.waited(c.grouped_allreduce_async, list(tensors), None, name, op, prescale,
                                                             postscale, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, pre, post, ps = ctx.args
        reduced = c.waited(c.grouped_allreduce_async, list(grads), None, None, op, pre, post, ps)
        return (None, None, None, None, None, *reduced)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return the reduction of `tensor` across the set (default Average); differentiable.

    Example:
        >>> hvd.allreduce(torch.tensor([1.0, 2.0]), op=hvd.Sum)   # doctest: +SKIP
        tensor([2., 4.])                                        # on 2 ranks
    """
    resolved = core.resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    summed = _Allreduce.apply(compressed, name, resolved, prescale_factor, postscale_factor, process_set)
    return compression.decompress(summed, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors as one atomic group (fused together); differentiable."""
    resolved = core.resolve_op(op, average)
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, resolved, prescale_factor, postscale_factor, process_set,
                                   *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def _own_rows(grad: torch.Tensor, dim0: int, process_set: ProcessSet) -> torch.Tensor:
    sizes = c.waited(c.allgather_async, torch.tensor([dim0], dtype=torch.int64), None, process_set)
    offset = int(sizes[: set_rank(process_set)].sum())
    return grad.narrow(0, offset, dim0)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.dim0, ctx.process_set = tensor.shape[0], process_set
        return c.waited(c.allgather_async, tensor, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = c.waited(c.allreduce_async, grad, None, None, ReduceOp.AVERAGE,
                                                  process_set=ctx.process_set)
        return _own_rows(reduced, ctx.dim0, ctx.process_set), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.dim0s, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(c.waited(c.grouped_allgather_async, list(tensors), name, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ps = ctx.process_set
        reduced = c.waited(c.grouped_allreduce_async, list(grads), None, None, ReduceOp.AVERAGE,
                                                          process_set=ps)
        sizes = c.waited(c.allgather_async, torch.tensor([ctx.dim0s], dtype=torch.int64), None, ps)
        offsets = sizes[: set_rank(ps)].sum(0)
        return (None, None, *[g.narrow(0, int(o), d) for g, o, d in zip(reduced, offsets, ctx.dim0s)])


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dimension 0 (first dimensions may differ); differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Gather a list of tensors as one group; differentiable."""
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return c.waited(c.broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = c.waited(c.allreduce_async, grad, None, None, ReduceOp.AVERAGE,
                                                  process_set=ctx.process_set)
        if job().rank != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank `root_rank`'s `tensor` on every rank of the set; differentiable."""
    return _Broadcast.apply(tensor, int(root_rank), name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None, name: str | None,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = c.waited(c.alltoall_async, tensor, splits, name, process_set)
        ctx.received, ctx.process_set, ctx.dim0 = received, process_set, tensor.shape[0]
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor,
                 _received: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        back, _ = c.waited(c.alltoall_async, grad.contiguous(), ctx.received, None, ctx.process_set)
        if back.shape[0] < ctx.dim0:  # rows beyond sum(splits) were not sent: zero gradient
            pad = back.new_zeros((ctx.dim0 - back.shape[0], *back.shape[1:]))
            back = torch.cat([back, pad])
        return back, None, None, None


@overload
def alltoall(tensor: torch.Tensor, splits: None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> torch.Tensor: ...


@overload
def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int], name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[torch.Tensor, torch.Tensor]: ...


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
             name: str | None = None, process_set: ProcessSet = global_process_set,
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send dim-0 slices to each rank (per `splits`, default equal) and gather theirs; differentiable.

    Returns the output, or ``(output, received_splits)`` when `splits` is given.
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, process_set: ProcessSet,
                prescale: float, postscale: float) -> torch.Tensor:
        ctx.args = (op, process_set, prescale, postscale)
        return c.waited(c.reducescatter_async, tensor, name, op, process_set, prescale, postscale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, ps, pre, post = ctx.args
        gathered = c.waited(c.allgather_async, grad.contiguous(), None, ps)
        return _scale_back(gathered, op, ps, pre, post), None, None, None, None, None


def _scale_back(gathered: torch.Tensor, op: ReduceOp, ps: ProcessSet, pre: float,
                post: float) -> torch.Tensor:
    factor = (set_size(ps) if op is ReduceOp.SUM else 1.0) * pre * post
    return gathered * factor if factor != 1.0 else gathered


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, process_set: ProcessSet, prescale: float,
                postscale: float, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, process_set, prescale, postscale)
        return tuple(c.waited(c.grouped_reducescatter_async, list(tensors), name, op, process_set,
                                                                 prescale, postscale))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, ps, pre, post = ctx.args
        gathered = c.waited(c.grouped_allgather_async, [g.contiguous() for g in grads], None, ps)
        return (None, None, None, None, None, *[_scale_back(g, op, ps, pre, post) for g in gathered])


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none,
                  op: ReduceOp | None = ReduceOp.AVERAGE,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` across the set and return this rank's dim-0 slice; differentiable.

    When dim 0 is not divisible by the set size, the first ``dim0 % size`` ranks get one extra row.
    """
    resolved = core.reducescatter_op(op)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, resolved, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none,
                          op: ReduceOp | None = ReduceOp.AVERAGE,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one group; differentiable."""
    resolved = core.reducescatter_op(op)
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, resolved, process_set, prescale_factor, postscale_factor,
                                       *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


