"""The framework-neutral compression core without MPI: casts, sparsifiers with error feedback, slice plans."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unison.compression import (
    Compression,
    Exchange,
    PartialSync,
    TopKCompressor,
    payload_bytes,
    scatter_sum,
    slice_plan,
)
from unison.errors import InvalidArgumentError


def test_casts_halve_the_payload_and_round_trip_within_precision() -> None:
    x = np.linspace(-5, 5, 101, dtype=np.float32)
    for scheme, bits in [(Compression.fp16, 11), (Compression.bf16, 8)]:
        payload, ctx = scheme.compress(x)
        assert payload_bytes(payload) * 2 == x.nbytes
        back = scheme.decompress(payload, ctx)
        assert back.dtype == np.float32
        assert np.all(np.abs(back - x) <= 2.0 ** -bits * np.abs(x) + 1e-7)
    ints = np.arange(4, dtype=np.int32)
    assert Compression.fp16.compress(ints)[0] is not None and Compression.fp16.compress(ints)[0].dtype == np.int32


@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=200), st.floats(0.01, 1.0))
def test_topk_with_error_feedback_never_loses_mass(values, ratio) -> None:
    x = np.array(values, dtype=np.float32)
    c = TopKCompressor(ratio)
    sent_total = np.zeros_like(x)
    for step in range(3):
        (idx, vals), ctx = c.compress(x, "w")
        assert idx.dtype == np.int32 and idx.size == min(x.size, max(1, math.ceil(ratio * x.size)))
        sent_total += c.decompress((idx, vals), ctx)
        # what was sent plus what is kept equals everything fed in so far
        np.testing.assert_allclose(sent_total + c.residual("w"), (step + 1) * x,
                                   rtol=1e-5, atol=1e-3)


def test_topk_selects_largest_magnitudes() -> None:
    c = Compression.topk(0.25)
    (idx, vals), _ = c.compress(np.array([0.1, -9.0, 3.0, 0.2, 8.0, 0.0, -0.5, 1.0]), "w")
    assert sorted(idx.tolist()) == [1, 4]
    assert c.statistics() == {"compressed": 1, "dense_bytes": 64, "payload_bytes": 2 * 4 + 2 * 8,
                              "sent_entries": 2}


def test_threshold_and_scatter_sum_add_repeated_indices() -> None:
    c = Compression.threshold(1.0)
    (idx, vals), ctx = c.compress(np.array([[2.0, 0.5], [-1.0, -1.5]]), "m")
    assert idx.tolist() == [0, 3]  # |-1.0| does not exceed 1.0
    gathered = (np.concatenate([idx, idx]), np.concatenate([vals, vals]))
    np.testing.assert_array_equal(c.decompress(gathered, ctx), [[4.0, 0.0], [0.0, -3.0]])
    np.testing.assert_array_equal(scatter_sum(np.array([1, 1]), np.array([1.0, 2.0]), 3, np.float32), [0, 3, 0])


@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.integers(1, 9))
def test_slice_plan_covers_every_element_once_per_rotation(sizes, parts) -> None:
    seen = [np.zeros(s, dtype=int) for s in sizes]
    lengths = []
    for step in range(parts):
        plan = slice_plan(sizes, parts, step)
        lengths.append(sum(b - a for _, a, b in plan))
        for i, a, b in plan:
            seen[i][a:b] += 1
    assert all((s == 1).all() for s in seen)
    assert max(lengths) - min(lengths) <= 1
    assert slice_plan(sizes, parts, parts) == slice_plan(sizes, parts, 0)


def test_partial_sync_rotates_and_counts() -> None:
    p = PartialSync(0.3)
    assert p.parts == 4 and p.exchange is Exchange.PARTIAL
    assert [p.next_plan([8]) for _ in range(5)][-1] == [(0, 0, 2)]
    assert p.statistics()["steps"] == 5


@pytest.mark.parametrize("make, message", [
    (lambda: Compression.topk(0.0), r"Top-K ratio must be in \(0, 1\]. Got ratio=0.0."),
    (lambda: Compression.threshold(-1), r"threshold must be a number >= 0. Got threshold=-1."),
    (lambda: Compression.partial(2), r"fraction must be in \(0, 1\]. Got fraction=2."),
])
def test_bad_arguments_name_the_rule_and_value(make, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make()
