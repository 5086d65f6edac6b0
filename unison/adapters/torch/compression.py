"""Gradient compression for torch: Horovod's none/fp16, plus bf16, top-K, threshold, partial sync, PowerSGD.

The casts act on torch tensors; the sparsifiers and the partial-synchronization schedule are the
framework-neutral ones from `unison.compression` (the optimizer hands them NumPy views).
"""

from __future__ import annotations

from typing import Any

import torch

from ...compression import Compression as _CoreCompression
from ...compression import Compressor as _CoreCompressor

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor(_CoreCompressor):
    """Interface: `compress` returns ``(tensor, ctx)``; `decompress(tensor, ctx)` undoes it."""

    # `ctx` is Any: each compressor keeps its own kind of context (a dtype, None) and declares it itself
    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and whatever `decompress` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return the received tensor in its original form."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 and cast back; other dtypes pass through.

    Works on the CPU too: the engine reduces float16 in float32 and rounds once.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.type(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype | None) -> torch.Tensor:
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.type(ctx)
        return tensor


class BF16Compressor(Compressor):
    """Send float32/float64 tensors as bfloat16 and cast back (reduced through float32)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
        dtype = tensor.dtype
        if dtype in (torch.float32, torch.float64):
            return tensor.to(torch.bfloat16), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype | None) -> torch.Tensor:
        return tensor if ctx is None or tensor.dtype == ctx else tensor.to(ctx)


class Compression(_CoreCompression):
    """The built-in compressors: Horovod's names, plus ``bf16`` and the stateful schemes.

    The casts act on torch tensors; ``topk(ratio)``, ``threshold(value)``, ``partial(fraction)`` and
    ``powersgd(rank)`` are the framework-neutral schemes and build instances that keep state: give
    each optimizer its own.
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
