"""`SyncBatchNorm`: batch normalization with statistics over the whole global batch, on CPU and CUDA tensors.

Forward allgathers each rank's (count, mean, biased variance) per channel and combines them with the
parallel-variance formula (stable, and exact for unequal per-rank batch sizes); backward allreduces
the per-channel sums of ``dy`` and ``dy * (x - mean)``. Horovod's version refuses CPU tensors.

One code path serves both devices: the statistics stay tensors on the input's device from the local
moments to the normalized output, so CUDA inputs are exchanged through the GPU data plane and the host
never reads them (no ``.item()``, no Python branch on a gathered value). The one exception is a rank
whose own batch is empty: it reads the global count to refuse a batch that is empty everywhere.

The exchanges are named after the layer (``sync_batch_norm.<n>.statistics`` and ``.gradient_sums``,
n numbering the layers in the order of their first synchronized forward, the same on every rank):
on CUDA, torch runs backward in its own device thread, where unnamed collectives are refused because
their order across threads is not the same on every rank. Stable names also let the response cache
serve every step after the first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..._job.runtime import job
from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from . import collectives as c

__all__ = ["SyncBatchNorm", "combine_statistics", "local_statistics"]


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """View (N, C, *) as (C, N * prod(*)) so that per-channel reductions are over dim 1."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _broadcastable(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def local_statistics(x: torch.Tensor) -> torch.Tensor:
    """This rank's row ``[count, mean_0..mean_C-1, var_0..var_C-1]`` (float64, on `x`'s device).

    Example:
        >>> local_statistics(torch.tensor([[1.0], [3.0]])).tolist()
        [[2.0, 2.0, 1.0]]
    """
    flat = _channels_last(x.detach()).double()
    channels, count = flat.shape
    mean = flat.mean(1) if count else flat.new_zeros(channels)
    var = flat.var(1, unbiased=False) if count else flat.new_zeros(channels)
    # new_full fills on the device: no host-to-device copy for the count
    return torch.cat([flat.new_full((1,), float(count)), mean, var]).unsqueeze(0)


def combine_statistics(gathered: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, biased variance, total count) of the global batch from every rank's `local_statistics`.

    Pure tensor arithmetic on `gathered`'s device; the total stays a 0-dim tensor. An empty global
    batch gives NaN statistics (the caller refuses it).

    Example:
        >>> rows = torch.cat([local_statistics(torch.tensor([[1.0]])), local_statistics(torch.tensor([[3.0]]))])
        >>> [t.item() for t in combine_statistics(rows, 1)]
        [2.0, 1.0, 2.0]
    """
    counts, means, variances = gathered[:, :1], gathered[:, 1:1 + channels], gathered[:, 1 + channels:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    var = (counts * (variances + (means - mean) ** 2)).sum(0) / total
    return mean, var, total


# `ctx` is Any: forward keeps what backward needs in attributes that torch's FunctionCtx does not declare.
class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float, name: str) -> torch.Tensor:
        channels = x.shape[1]
        stats = local_statistics(x)
        gathered = c.synchronize(c.allgather_async(stats, name=f"{name}.statistics"))
        mean, var, total = combine_statistics(gathered, channels)
        if x.numel() == 0 and float(total) == 0:
            # Only a rank with an empty batch reads the total; if it is zero, every rank is here.
            raise InvalidArgumentError("SyncBatchNorm got an empty batch on every rank.")
        if running_mean is not None and running_var is not None:
            # Bessel's correction, 1 for a global batch of one sample, without a host branch.
            correction = torch.where(total > 1, total / (total - 1).clamp(min=1), torch.ones_like(total))
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_((var * correction).to(running_var.dtype), alpha=momentum)
        invstd = torch.rsqrt(var + eps)
        mean_x, invstd_x = mean.to(x.dtype), invstd.to(x.dtype)
        y = (x - _broadcastable(mean_x, x)) * _broadcastable(invstd_x, x)
        if weight is not None:
            y = y * _broadcastable(weight, x)
        if bias is not None:
            y = y + _broadcastable(bias, x)
        ctx.save_for_backward(x, weight, mean_x, invstd_x)
        ctx.total = total
        ctx.name = name
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        xmu = x - _broadcastable(mean, x)
        dy_flat, xmu_flat = _channels_last(dy), _channels_last(xmu)
        local_sum_dy = dy_flat.sum(1)
        local_sum_dy_xmu = (dy_flat * xmu_flat).sum(1)
        sums = torch.cat([local_sum_dy, local_sum_dy_xmu]).double()
        # on CUDA this runs in torch's autograd device thread: named, never paired by call order
        sums = c.synchronize(c.allreduce_async(sums, op=ReduceOp.SUM, name=f"{ctx.name}.gradient_sums"))
        channels = mean.shape[0]
        # The global means of dy and dy * (x - mean), divided in float64 before narrowing to x's dtype.
        means = (sums / ctx.total).to(x.dtype)
        mean_dy, mean_dy_xmu = means[:channels], means[channels:]
        scale = invstd if weight is None else invstd * weight
        grad_x = _broadcastable(scale, x) * (
            dy - _broadcastable(mean_dy, x) - xmu * _broadcastable(invstd * invstd * mean_dy_xmu, x)
        )
        grad_w = local_sum_dy_xmu * invstd if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = local_sum_dy if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of every rank, on CPU and CUDA tensors.

    A drop-in for ``torch.nn.BatchNorm{1,2,3}d``: in training the mean and variance are computed over
    all ranks' samples (and the running statistics updated with them), so the output equals
    BatchNorm on the concatenated batch. In eval mode it is plain BatchNorm with running statistics.
    CUDA inputs exchange their statistics through the GPU data plane (NCCL), never through the host.
    Parameter gradients are this rank's share; DistributedOptimizer averages them like any other.

    Example:
        >>> bn = hvd.SyncBatchNorm(16)        # doctest: +SKIP
        >>> y = bn(torch.randn(8, 16, 4, 4))  # doctest: +SKIP
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        # (id of the job it was numbered in, the name): plain values, so the layer still pickles
        self._collective_name: tuple[int, str] | None = None

    def _name(self) -> str:
        """This layer's collective name, numbered at its first synchronized forward in the running job."""
        current = job()
        if self._collective_name is None or self._collective_name[0] != id(current):
            index = current.next_name_index("sync_batch_norm")
            self._collective_name = (id(current), f"sync_batch_norm.{index}")
        return self._collective_name[1]

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise InvalidArgumentError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        if not bn_training or job().size == 1:
            return F.batch_norm(input, self.running_mean if use_running else None,
                                self.running_var if use_running else None, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if use_running else None,
            self.running_var if use_running else None, self.eps, factor, self._name())
