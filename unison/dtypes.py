"""The element types unison carries, and which collectives accept each of them.

Buffers reach the engine as NumPy arrays. bfloat16 has no NumPy dtype of its own: it arrives either as an
``ml_dtypes.bfloat16`` array or as a uint16 view whose request says ``bfloat16`` (the torch adapter's
path). Half-precision values are never summed by MPI directly (MPICH crashes on float16): the executor
widens them to float32, reduces, and rounds once.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from .errors import UnsupportedDtypeError
from .ops import CollectiveKind

__all__ = ["DType", "bfloat16_to_float32", "check_supported", "dtype_of", "float32_to_bfloat16"]


class DType(enum.Enum):
    """A supported element type; the value is its canonical name."""

    UINT8 = "uint8"
    INT8 = "int8"
    UINT16 = "uint16"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @property
    def is_half(self) -> bool:
        """True for the 16-bit floating types that are reduced through float32."""
        return self in (DType.FLOAT16, DType.BFLOAT16)

    @property
    def is_float(self) -> bool:
        """True for the floating-point types."""
        return self in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def is_integer(self) -> bool:
        """True for the integer types (scaled through float64 and truncated, as Horovod does)."""
        return self.value.startswith(("int", "uint"))

    @property
    def storage(self) -> np.dtype:
        """The NumPy dtype of the buffer the engine moves (bfloat16 travels as uint16 bits)."""
        if self is DType.BFLOAT16:
            return np.dtype(np.uint16)
        return np.dtype(self.value)


_ITEMSIZE = {
    DType.UINT8: 1, DType.INT8: 1, DType.BOOL: 1,
    DType.UINT16: 2, DType.INT16: 2, DType.FLOAT16: 2, DType.BFLOAT16: 2,
    DType.INT32: 4, DType.FLOAT32: 4,
    DType.INT64: 8, DType.FLOAT64: 8,
}

_BY_NUMPY_NAME = {d.value: d for d in DType}
# Keyed by dtype object: dtype.name is a slow Python-level property, and this is the submit hot path.
_BY_NUMPY_DTYPE: dict[np.dtype, DType] = {np.dtype(d.value): d for d in DType if d is not DType.BFLOAT16}

_REDUCING = frozenset({CollectiveKind.ALLREDUCE, CollectiveKind.REDUCESCATTER})
_REDUCIBLE = tuple(d for d in DType if d is not DType.BOOL)
_ALL = tuple(DType)
_REDUCIBLE_SET = frozenset(_REDUCIBLE)


def dtype_of(array: np.ndarray) -> DType:
    """Return the `DType` of a NumPy array, refusing types unison cannot carry.

    Example:
        >>> dtype_of(np.zeros(3, np.float32))
        <DType.FLOAT32: 'float32'>
    """
    found = _BY_NUMPY_DTYPE.get(array.dtype)
    if found is not None:
        return found
    if not array.dtype.isnative:  # equal names, other bytes: MPI and the GPU plane read native order
        raise UnsupportedDtypeError(
            f"Tensor type {array.dtype.str} is in non-native byte order, which unison does not carry: "
            f"convert it first, e.g. array.astype(array.dtype.newbyteorder('='))."
        )
    name = array.dtype.name
    found = _BY_NUMPY_NAME.get(name)  # bfloat16 from ml_dtypes
    if found is None:
        supported = ", ".join(d.value for d in DType)
        raise UnsupportedDtypeError(
            f"Tensor type {name} is not supported. Supported types: {supported} (bool is gathered, "
            "broadcast and exchanged, never reduced)."
        )
    return found


def check_supported(kind: CollectiveKind, dtype: DType) -> None:
    """Raise `UnsupportedDtypeError` if `kind` cannot carry `dtype` (bool is never reduced)."""
    if kind not in _REDUCING or dtype in _REDUCIBLE_SET:
        return
    allowed = _REDUCIBLE if kind in _REDUCING else _ALL
    if dtype not in allowed:
        names = ", ".join(d.value for d in allowed)
        raise UnsupportedDtypeError(
            f"{kind.value} does not support dtype {dtype.value}. Supported types: {names}."
        )


def bfloat16_to_float32(bits: Any, xp: Any = np) -> Any:
    """Widen bfloat16 values held as uint16 bits to float32 (exact); `xp` is NumPy or CuPy."""
    return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def float32_to_bfloat16(values: Any, out: Any = None, xp: Any = np) -> Any:
    """Round float32 values to bfloat16 bits (uint16), to nearest even; a NaN becomes the quiet NaN
    0x7FC0, as torch rounds it. `xp` is NumPy or CuPy (no host synchronization on CuPy)."""
    wide = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    rounded = (wide + (xp.uint32(0x7FFF) + ((wide >> xp.uint32(16)) & xp.uint32(1)))) >> xp.uint32(16)
    result = rounded.astype(xp.uint16)
    nan = xp.isnan(values)
    if xp is not np or nan.any():  # NumPy: skip the masked write when there is no NaN (the common case)
        xp.copyto(result, xp.uint16(0x7FC0), where=nan)
    if out is not None:
        out[...] = result.reshape(out.shape)
        return out
    return result
