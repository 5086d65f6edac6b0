"""Horovod's gradient compressors on NumPy arrays and tf tensors, shared by the TensorFlow and Keras adapters.

Works on tf tensors and on NumPy arrays (the Keras adapter's path on the torch backend), and imports
TensorFlow only when it meets a tf tensor, so Keras-on-torch never loads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..compression import Compression as _CoreCompression
from ..compression import Compressor as _CoreCompressor

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


def _cast(tensor: Any, dtype: str) -> Any:
    if isinstance(tensor, np.ndarray):
        if dtype == "bfloat16":
            import ml_dtypes

            return tensor.astype(ml_dtypes.bfloat16)
        return tensor.astype(dtype)
    import tensorflow as tf

    return tf.cast(tensor, dtype)


def _is_wide_float(tensor: Any) -> bool:
    dtype = tensor.dtype
    if isinstance(tensor, np.ndarray):
        return dtype in (np.float32, np.float64)
    return getattr(dtype, "is_floating", False) and dtype.size > 2


class Compressor(_CoreCompressor):
    """Interface: `compress` a tensor before the collective, `decompress` it after."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Return (tensor to send, context for `decompress`)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Undo `compress` using its context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class _CastCompressor(Compressor):
    """Send float32/float64 tensors as the 2-byte type `wire` and cast them back; others pass through."""

    wire = ""

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        if _is_wide_float(tensor):
            dtype = tensor.dtype
            return _cast(tensor, cls.wire), (dtype.name if hasattr(dtype, "name") else str(dtype))
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else _cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Send float32/float64 tensors as float16 (halves the bytes; reduced through float32)."""

    wire = "float16"


class BF16Compressor(_CastCompressor):
    """Send float32/float64 tensors as bfloat16 (halves the bytes; reduced through float32)."""

    wire = "bfloat16"


class Compression(_CoreCompression):
    """The available compressors: Horovod's ``none`` and ``fp16``, plus ``bf16`` (casts on tf tensors),
    and the stateful framework-neutral ``topk(ratio)``, ``threshold(value)``, ``powersgd(rank)`` (with
    error feedback; `DistributedGradientTape` and the Keras optimizer) and ``partial(fraction)`` (Keras
    optimizer)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
