"""Gradient compression for torch collectives: Horovod's `Compression.none` and `Compression.fp16`."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: `compress` returns ``(tensor, ctx)``; `decompress(tensor, ctx)` undoes it."""

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
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 and cast back; other dtypes pass through.

    Works on the CPU too: the engine reduces float16 in float32 and rounds once.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.type(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.type(ctx)
        return tensor


class Compression:
    """The built-in compressors, by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
