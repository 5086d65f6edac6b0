"""The arithmetic of unison's collectives on buffers, written once over an array module: NumPy for the
host executor (`engine/executor.py`), CuPy for the GPU data plane (`gpu/device.py`; NumPy again under
the fake device), so a collective computes the same bits on either plane.

The rules, Horovod's where it has them:

- float32 and float64 scale in their own precision;
- integers scale through float64 and truncate toward zero;
- float16 and bfloat16 are held and moved as 2-byte values, but their arithmetic is float32: widened,
  scaled and reduced in float32, rounded once to nearest even (a NaN stays NaN). bfloat16 is held as
  uint16 bits everywhere: neither NumPy nor CuPy has a bfloat16 dtype.

On the host, float16 casts go through torch when the application already imported it: its vectorized
(F16C) kernels are 4x (widening) to 13x (rounding) faster than NumPy's here and round identically
(`tests/unit/engine/test_numerics.py` checks every bit pattern). Nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType, bfloat16_to_float32, float32_to_bfloat16
from ..ops import ReduceOp

__all__ = ["REDUCERS", "copy_scaled_", "elements", "half_combiner", "narrow", "raw", "scale_", "widen"]

_UNSIGNED = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def raw(array: Any) -> Any:
    """A contiguous array viewed flat as unsigned integers of its item size, so that operations that
    only move bytes never see a type a transport lacks."""
    return array.reshape(-1).view(_UNSIGNED[array.itemsize])


def elements(shape: Sequence[int]) -> int:
    """The number of elements of `shape`."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def _torch(xp: Any) -> Any:
    """torch, when `xp` is NumPy and the application already imported it (never imported here)."""
    return sys.modules.get("torch") if xp is np else None


def widen(values: Any, dtype: DType, xp: Any = np) -> Any:
    """float16 values (or their bits) or bfloat16 bits -> a new flat float32 array."""
    flat = values.reshape(-1)
    if dtype is DType.BFLOAT16:
        return bfloat16_to_float32(flat, xp)
    torch = _torch(xp)
    if torch is not None and flat.flags.writeable:
        widened: np.ndarray = torch.from_numpy(flat.view(np.float16)).float().numpy()
        return widened
    return flat.view(xp.float16).astype(xp.float32)


def narrow(values: Any, dtype: DType, xp: Any = np) -> Any:
    """float32 values -> float16 or bfloat16 as uint16 bits, flat, rounded to nearest even."""
    flat = values.reshape(-1)
    if dtype is DType.BFLOAT16:
        return float32_to_bfloat16(flat, xp=xp)
    torch = _torch(xp)
    if torch is not None and flat.flags.writeable and flat.flags.c_contiguous:
        rounded: np.ndarray = torch.from_numpy(flat).half().numpy().view(np.uint16)
        return rounded
    return flat.astype(xp.float16).view(xp.uint16)


def _scaled(src: Any, factor: float, dtype: DType, xp: Any) -> Any:
    """``src * factor`` by the rules above, as a new flat array of `src`'s storage."""
    flat = src.reshape(-1)
    if dtype.is_half:
        wide = widen(flat, dtype, xp)
        wide *= xp.float32(factor)
        return narrow(wide, dtype, xp).view(flat.dtype)
    if dtype.is_integer:
        return (flat.astype(xp.float64) * factor).astype(flat.dtype)
    return flat * flat.dtype.type(factor)


def scale_(buf: Any, factor: float, dtype: DType, xp: Any = np) -> None:
    """Multiply the contiguous `buf` in place by `factor`."""
    if factor == 1.0:
        return
    flat = buf.reshape(-1)
    if dtype.is_half or dtype.is_integer:
        flat[...] = _scaled(flat, factor, dtype, xp)
    else:
        xp.multiply(flat, flat.dtype.type(factor), out=flat)


def copy_scaled_(dst: Any, src: Any, factor: float, dtype: DType, xp: Any = np) -> None:
    """Write ``src * factor`` into the contiguous `dst` (as many elements, `dst`'s storage dtype)."""
    flat = dst.reshape(-1)
    if factor == 1.0:
        raw(flat)[...] = raw(src)
    elif dtype.is_half or dtype.is_integer:
        flat[...] = _scaled(src, factor, dtype, xp)
    else:
        xp.multiply(src.reshape(-1), flat.dtype.type(factor), out=flat)


# How an op combines the members' values along axis 0 (Average is a Sum, scaled after).
REDUCERS: dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.SUM: np.sum, ReduceOp.AVERAGE: np.sum, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max,
    ReduceOp.PRODUCT: np.prod}


def half_combiner(dtype: DType, op: ReduceOp, pre: float, post: float) -> Callable[[np.ndarray], np.ndarray]:
    """The combine step of a half-precision reduction on the host (`Backend.allreduce_pieces_`):
    (members, n) 2-byte bits -> n bits, reduced in float32 in rank order, scaled by `pre` before and
    `post` after, rounded once."""
    reducer = REDUCERS[op]

    def combine(bits: np.ndarray) -> np.ndarray:
        wide = widen(bits, dtype).reshape(bits.shape)
        if pre != 1.0:
            wide *= np.float32(pre)
        acc = reducer(wide, axis=0)
        if post != 1.0:
            acc *= np.float32(post)
        result: np.ndarray = narrow(np.ascontiguousarray(acc), dtype)
        return result

    return combine
