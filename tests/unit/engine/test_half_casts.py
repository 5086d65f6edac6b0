"""The executor's float16 casts: torch's vectorized kernels (used when torch is loaded) and NumPy's
give the same bits, for every float16 value and for float32 values that round."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from unison.dtypes import DType
from unison.engine import executor

torch = pytest.importorskip("torch")


def both(fn, monkeypatch):
    with_torch = fn()
    monkeypatch.setitem(sys.modules, "torch", None)
    assert executor._torch() is None
    without = fn()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return with_torch, without


def test_widening_every_float16_bit_pattern_matches(monkeypatch) -> None:
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    a, b = both(lambda: executor._widen(bits, DType.FLOAT16), monkeypatch)
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
        a, b = both(lambda: executor._round_to_float16(values.copy()), monkeypatch)
    nan = np.isnan(b.view(np.float16))
    assert (np.isnan(a.view(np.float16)) == nan).all() and (a[~nan] == b[~nan]).all()


def test_the_half_combiner_sums_in_float32_and_rounds_once(monkeypatch) -> None:
    rng = np.random.default_rng(4)
    pieces = rng.standard_normal((3, 1000)).astype(np.float16)
    combine = executor._half_combiner(DType.FLOAT16, executor.ReduceOp.AVERAGE, 0.5, 2.0 / 3)
    a, b = both(lambda: combine(pieces.view(np.uint16).copy()), monkeypatch)
    want = (pieces.astype(np.float32) * np.float32(0.5)).sum(0) * np.float32(2.0 / 3)
    assert (a == b).all() and (a == want.astype(np.float16).view(np.uint16)).all()
