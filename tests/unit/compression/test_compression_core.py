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
    PowerSGDCompressor,
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
    (lambda: Compression.powersgd(0), r"PowerSGD rank must be an integer >= 1. Got rank=0."),
    (lambda: Compression.powersgd(1.5), r"PowerSGD rank must be an integer >= 1. Got rank=1.5."),
])
def test_bad_arguments_name_the_rule_and_value(make, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make()


def _powersgd_step(compressors: list[PowerSGDCompressor], grads: list[np.ndarray], name: str) -> np.ndarray:
    """One PowerSGD step of len(grads) simulated ranks, the sums done by hand; returns the result."""
    begun = [c.begin(g, name) for c, g in zip(compressors, grads)]
    p_sum = sum(p for p, _ in begun)
    q_sum = sum(c.middle(state, p_sum.copy()) for c, (_, state) in zip(compressors, begun))
    results = [c.end(state, q_sum.copy()) for c, (_, state) in zip(compressors, begun)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])  # every rank gets the same approximation
    return results[0]


@given(st.integers(1, 3), st.integers(0, 2**16))
def test_powersgd_error_feedback_never_loses_mass(ranks, seed) -> None:
    """Over any number of steps, what was applied plus what the ranks still hold equals the sum of
    everything the ranks produced: the approximation delays gradient mass, never drops it."""
    rng = np.random.default_rng(seed)
    compressors = [PowerSGDCompressor(rank=1) for _ in range(ranks)]
    applied = np.zeros((6, 5))
    produced = np.zeros((6, 5))
    for _ in range(3):
        grads = [rng.standard_normal((6, 5)) for _ in range(ranks)]
        produced += sum(grads)
        applied += _powersgd_step(compressors, grads, "w")
    held = sum(c.residual("w") for c in compressors)
    np.testing.assert_allclose(applied + held, produced, atol=1e-9)


def test_powersgd_is_exact_for_a_gradient_of_its_rank_and_sends_the_factors() -> None:
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal((40, 2)), rng.standard_normal((2, 30))
    grads = [u @ v * (r + 1) for r in range(3)]  # rank 2 on every rank, same column space
    compressors = [PowerSGDCompressor(rank=2) for _ in range(3)]
    result = _powersgd_step(compressors, [g.astype(np.float32) for g in grads], "w")
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, sum(grads), rtol=1e-4, atol=1e-4)
    assert np.abs(compressors[0].residual("w")).max() < 1e-4
    stats = compressors[0].statistics()
    assert stats["payload_bytes"] == 2 * (40 + 30) * 4 and stats["dense_bytes"] == 40 * 30 * 4


def test_powersgd_views_tensors_as_matrices_and_sends_small_ones_dense() -> None:
    c = PowerSGDCompressor(rank=4)
    assert c.matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert c.matrix_shape((128,)) is None  # vectors
    assert c.matrix_shape((8, 8)) is None  # 4 * 16 >= 64: the factors would not be smaller
    assert c.exchange is Exchange.LOWRANK
    with pytest.raises(InvalidArgumentError, match="two exchanges per step"):
        c.compress(np.zeros((64, 27)))
    with pytest.raises(InvalidArgumentError, match="send it dense"):
        c.begin(np.zeros(128), "bias")


def test_powersgd_warm_start_is_the_same_on_every_rank_and_reset_forgets() -> None:
    a, b = PowerSGDCompressor(rank=1), PowerSGDCompressor(rank=1)
    g = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(a.begin(g, "w")[0], b.begin(g, "w")[0])
    _powersgd_step([a], [g], "w")
    assert a.residual("w") is not None
    a.reset()
    assert a.residual("w") is None
