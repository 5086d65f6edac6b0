"""Half-precision casts on NumPy arrays: float16 (Horovod's fp16) and bfloat16 on the wire."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import Compressor

__all__ = ["BF16Compressor", "FP16Compressor", "NoneCompressor"]


class NoneCompressor(Compressor):
    """Send arrays unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(payload: Any, context: Any) -> Any:
        return payload


def _wide_float(array: np.ndarray) -> bool:
    return array.dtype in (np.float32, np.float64)


class FP16Compressor(Compressor):
    """Send float32/float64 arrays as float16 and cast back; other dtypes pass through.

    The engine sends the 2-byte values and sums them in float32, rounding once, so the sum loses no
    more than one float16 rounding of each input and of the result.
    """

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        array = np.asarray(tensor)
        if _wide_float(array):
            return array.astype(np.float16), array.dtype
        return array, None

    @staticmethod
    def decompress(payload: Any, context: Any) -> Any:
        return payload if context is None else np.asarray(payload).astype(context)


def _bfloat16() -> Any:
    import ml_dtypes  # a dependency of tensorflow and jax; only bf16 on NumPy needs it

    return ml_dtypes.bfloat16


class BF16Compressor(Compressor):
    """Send float32/float64 arrays as bfloat16 (float32's range, 8 bits of mantissa) and cast back."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        array = np.asarray(tensor)
        if _wide_float(array):
            return array.astype(_bfloat16()), array.dtype
        return array, None

    @staticmethod
    def decompress(payload: Any, context: Any) -> Any:
        return payload if context is None else np.asarray(payload).astype(context)
