"""The numerics every plane shares: on the host, torch's vectorized float16 casts (used when torch is
loaded) and NumPy's give the same bits, for every float16 value and for float32 values that round; the
scaling rules per dtype."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from unison.dtypes import DType
from unison.engine import numerics
from unison.ops import ReduceOp


def both(fn, monkeypatch):
    torch = pytest.importorskip("torch")
    with_torch = fn()
    monkeypatch.setitem(sys.modules, "torch", None)
    assert numerics._torch(np) is None
    without = fn()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return with_torch, without


def test_widening_every_float16_bit_pattern_matches(monkeypatch) -> None:
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    a, b = both(lambda: numerics.widen(bits, DType.FLOAT16), monkeypatch)
    assert a.dtype == b.dtype == np.float32
    nan = np.isnan(b)
    assert (np.isnan(a) == nan).all() and (a[~nan].view(np.uint32) == b[~nan].view(np.uint32)).all()


def test_rounding_to_float16_matches_including_ties_overflow_and_subnormals(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([
        rng.standard_normal(100_000).astype(np.float32) * 1000,
        rng.integers(0, 2**32, size=100_000, dtype=np.uint32).view(np.float32),  # every exponent
        (np.arange(2**16, dtype=np.float32) + 0.5) * 2.0**-24,  # ties among subnormals
        np.array([65504.0, 65520.0, 1e9, -1e9, np.inf, -np.inf], np.float32),
    ])
    with np.errstate(over="ignore"):
        a, b = both(lambda: numerics.narrow(values.copy(), DType.FLOAT16), monkeypatch)
    nan = np.isnan(b.view(np.float16))
    assert (np.isnan(a.view(np.float16)) == nan).all() and (a[~nan] == b[~nan]).all()


def test_the_half_combiner_sums_in_float32_and_rounds_once(monkeypatch) -> None:
    rng = np.random.default_rng(4)
    pieces = rng.standard_normal((3, 1000)).astype(np.float16)
    combine = numerics.half_combiner(DType.FLOAT16, ReduceOp.AVERAGE, 0.5, 2.0 / 3)
    a, b = both(lambda: combine(pieces.view(np.uint16).copy()), monkeypatch)
    want = (pieces.astype(np.float32) * np.float32(0.5)).sum(0) * np.float32(2.0 / 3)
    assert (a == b).all() and (a == want.astype(np.float16).view(np.uint16)).all()


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT32, DType.INT64, DType.UINT8])
def test_integers_scale_through_float64_and_truncate_toward_zero(dtype: DType) -> None:
    signed = [-7, -3, 0, 3, 7] if dtype is not DType.UINT8 else [0, 3, 7, 200, 255]
    values = np.array(signed, dtype=dtype.storage)
    buf = values.copy()
    numerics.scale_(buf, 1 / 3, dtype)
    assert buf.tolist() == np.trunc(values.astype(np.float64) / 3).astype(values.dtype).tolist()
    out = np.empty_like(values)
    numerics.copy_scaled_(out, values, 2.5, dtype)
    assert out.tolist() == np.trunc(values.astype(np.float64) * 2.5).astype(values.dtype).tolist()


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT64])
def test_floats_scale_in_their_own_precision(dtype: DType) -> None:
    values = np.random.default_rng(5).standard_normal(1000).astype(dtype.storage)
    buf = values.copy()
    numerics.scale_(buf, 0.1, dtype)
    assert buf.dtype == values.dtype
    assert (buf == values * values.dtype.type(0.1)).all()


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.BFLOAT16])
def test_half_scaling_is_float32_arithmetic_rounded_once(dtype: DType) -> None:
    wide = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
    bits = numerics.narrow(wide, dtype)
    buf = bits.view(np.float16).copy() if dtype is DType.FLOAT16 else bits.copy()
    numerics.scale_(buf, 1 / 3, dtype)
    want = numerics.narrow(numerics.widen(bits, dtype) * np.float32(1 / 3), dtype)
    assert (numerics.raw(buf) == want).all()
    # a NaN stays NaN (as torch's quiet NaN for bfloat16), infinities stay infinite
    special = numerics.narrow(np.array([np.nan, np.inf, -np.inf], np.float32), dtype)
    back = numerics.widen(special, dtype)
    assert np.isnan(back[0]) and back[1] == np.inf and back[2] == -np.inf
