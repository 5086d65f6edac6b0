"""Adasum: the halving plan and the coefficients by hand, the whole run over threads against a NumPy reference."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from unison.backends.loopback import ThreadGroup
from unison.engine.adasum import NORM_FLOOR, Level, adasum_, coefficients, is_power_of_two, plan

TIMEOUT = 20.0


def reference(vectors: list[np.ndarray], lengths: list[int], work: type) -> np.ndarray:
    """The Adasum tree written out: pairs (0,1), (2,3), ..., then their results, per tensor, with the
    dot products over whole tensors in float64 and each level's result stored in `work`."""
    level = [v.astype(work) for v in vectors]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    while len(level) > 1:
        combined = []
        for a, b in zip(level[0::2], level[1::2]):
            out = np.empty_like(a)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                a64, b64 = a[start:stop].astype(np.float64), b[start:stop].astype(np.float64)
                dot, aa, bb = a64 @ b64, a64 @ a64, b64 @ b64
                ca = 1.0 - dot / aa / 2 if aa >= NORM_FLOOR else 1.0
                cb = 1.0 - dot / bb / 2 if bb >= NORM_FLOOR else 1.0
                out[start:stop] = ca * a64 + cb * b64
            combined.append(out)
        level = combined
    return level[0]


def run_threads(vectors: list[np.ndarray], lengths: list[int]) -> list[np.ndarray]:
    size = len(vectors)
    group = ThreadGroup(size)
    results: list[np.ndarray | None] = [None] * size
    errors: list[BaseException] = []

    def rank_fn(rank: int) -> None:
        try:
            work = vectors[rank].copy()
            adasum_(work, lengths, group.backend(rank), rank, size)
            results[rank] = work
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_fn, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a rank hung"
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def test_plan_for_four_ranks_over_ten_elements() -> None:
    assert plan(0, 4, 10) == (
        [Level(1, 1, True, (0, 5), (5, 10)), Level(2, 2, True, (0, 2), (2, 5))], (0, 2)
    )
    assert plan(3, 4, 10) == (
        [Level(1, 2, False, (5, 10), (0, 5)), Level(2, 1, False, (7, 10), (5, 7))], (7, 10)
    )
    finals = sorted(plan(r, 4, 10)[1] for r in range(4))
    assert finals == [(0, 2), (2, 5), (5, 7), (7, 10)]  # the final segments tile the vector


def test_plan_at_one_rank_has_no_levels_and_refuses_other_sizes() -> None:
    assert plan(0, 1, 7) == ([], (0, 7))
    assert [is_power_of_two(n) for n in (1, 2, 3, 4, 6, 8)] == [True, True, False, True, False, True]
    with pytest.raises(ValueError, match=r"power-of-two number of ranks. Got size=3"):
        plan(0, 3, 10)
    with pytest.raises(ValueError, match=r"rank must be in range\(size=4\). Got rank=4"):
        plan(4, 4, 10)


def test_coefficients_halve_equal_vectors_keep_orthogonal_ones_and_ignore_zero_norms() -> None:
    dots = np.array([[4.0, 4.0, 4.0],     # a == b: each weighted 1/2, the result is a
                     [0.0, 1.0, 9.0],     # orthogonal: summed
                     [0.0, 0.0, 2.0],     # a is zero: b unchanged
                     [-4.0, 4.0, 4.0]])   # a == -b: each weighted 3/2, the result is zero
    a_coeff, b_coeff = coefficients(dots)
    np.testing.assert_array_equal(a_coeff, [0.5, 1.0, 1.0, 1.5])
    np.testing.assert_array_equal(b_coeff, [0.5, 1.0, 1.0, 1.5])


def test_coefficients_weigh_norms_far_below_one_and_floor_only_below_float64s_range() -> None:
    tiny = float(np.finfo(np.float32).tiny)  # float32's smallest normal value, about 1.2e-38
    a = np.full(1024, tiny)
    b = 3.0 * a
    dots = np.array([[a @ b, a @ a, b @ b],          # squared norms near 1e-73: weighted by the formula
                     [1e-160, 1e-160, 4.0]])          # below NORM_FLOOR (about 1.5e-154): coefficient 1
    a_coeff, b_coeff = coefficients(dots)
    np.testing.assert_allclose(a_coeff, [-0.5, 1.0], rtol=1e-12)
    np.testing.assert_allclose(b_coeff, [0.5 + 1 / 3, 1.0 - 1e-160 / 8], rtol=1e-12)
    np.testing.assert_allclose(a_coeff[0] * a + b_coeff[0] * b, (a + b) / 2, rtol=1e-12)  # parallel: the mean
    assert NORM_FLOOR == np.sqrt(np.finfo(np.float64).tiny)


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adasum_over_threads_matches_the_tree_and_is_the_same_bits_everywhere(size: int, dtype: type) -> None:
    rng = np.random.default_rng(size)
    lengths = [7, 1, 0, 33, 4]  # odd lengths split unevenly; an empty tensor; one shorter than the set
    total = sum(lengths)
    vectors = [rng.standard_normal(total).astype(dtype) for _ in range(size)]
    vectors[-1][:7] = 0.0  # a zero tensor on one rank leaves the other's unchanged
    results = run_threads(vectors, lengths)
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])
    want = reference(vectors, lengths, dtype)
    # the same formula; only the order in which the dot products' pieces are added differs
    rtol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(results[0], want, rtol=rtol, atol=rtol)


def test_equal_gradients_give_their_value_and_orthogonal_ones_their_sum() -> None:
    same = [np.array([3.0, -1.0, 2.0])] * 4
    np.testing.assert_allclose(run_threads([v.copy() for v in same], [3])[0], same[0])
    axes = [np.eye(4)[i] for i in range(4)]
    np.testing.assert_allclose(run_threads(axes, [4])[0], np.ones(4))
