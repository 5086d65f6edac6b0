"""op=Adasum across real processes: the tree formula on every API, its limits with Horovod's errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import unison as hvd
from unison.engine.adasum import NORM_FLOOR, is_power_of_two

BF16 = np.dtype(ml_dtypes.bfloat16)
SIZE = MPI.COMM_WORLD.Get_size()
RANK_ZERO = hvd.ProcessSet([0])  # registered at init (2 ranks and up) for the non-global-set case


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init(process_sets=[RANK_ZERO] if SIZE > 1 else None)
    yield
    hvd.shutdown()


def tree(vectors: list[np.ndarray], work: type) -> np.ndarray:
    """Adasum over ranks written out for one tensor: pairs (0,1), (2,3), ..., then their results."""
    level = [v.astype(work) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            dot, aa, bb = a64 @ b64, a64 @ a64, b64 @ b64
            ca = 1.0 - dot / aa / 2 if aa >= NORM_FLOOR else 1.0
            cb = 1.0 - dot / bb / 2 if bb >= NORM_FLOOR else 1.0
            nxt.append((ca * a64 + cb * b64).astype(work))
        level = nxt
    return level[0]


def rank_vector(rank: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed * 1000 + rank).standard_normal(n)


def everyone(value: np.ndarray) -> list[np.ndarray]:
    return list(hvd.allgather(value[None, ...]))


pow2 = pytest.mark.skipif(not is_power_of_two(SIZE), reason="Adasum needs 1, 2, 4, ... ranks")


@pow2
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allreduce_adasum_is_the_tree_formula_and_the_same_bits_everywhere(dtype: type) -> None:
    x = rank_vector(hvd.rank(), 1001).astype(dtype)
    got = hvd.allreduce(x, op=hvd.Adasum, name="adasum.plain")
    rtol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(got, tree([rank_vector(r, 1001).astype(dtype) for r in range(hvd.size())],
                                         dtype), rtol=rtol, atol=rtol)
    for other in everyone(got):
        np.testing.assert_array_equal(other, got)


@pow2
def test_grouped_adasum_combines_each_tensor_on_its_own() -> None:
    shapes = [(3, 4), (5,), (1,), (64, 2)]
    xs = [rank_vector(hvd.rank(), int(np.prod(s)), seed=i).reshape(s) for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce(xs, op=hvd.Adasum, name="adasum.group")
    for i, (s, g) in enumerate(zip(shapes, got)):
        want = tree([rank_vector(r, int(np.prod(s)), seed=i) for r in range(hvd.size())], np.float64)
        np.testing.assert_allclose(g.reshape(-1), want, rtol=1e-12, atol=1e-12)
        assert g.shape == s


@pow2
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_half_precision_adasum_runs_in_float32_and_rounds_once(dtype: np.dtype) -> None:
    x = rank_vector(hvd.rank(), 257).astype(dtype)
    got = hvd.allreduce(x, op=hvd.Adasum, name=f"adasum.{np.dtype(dtype).name}")
    assert got.dtype == np.dtype(dtype)
    want = tree([rank_vector(r, 257).astype(dtype).astype(np.float32) for r in range(hvd.size())],
                np.float32).astype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2 ** -7, atol=2 ** -7)


@pow2
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("spread", ["tiny", "wide"])
def test_parallel_vectors_at_the_ends_of_the_dtypes_range_give_their_mean(dtype: type, spread: str) -> None:
    # Each rank holds a multiple of one vector. Adasum of parallel vectors is their mean, also when
    # the entries are near the dtype's smallest normal value (squared norms near 1e-73 for float32)
    # or when the ranks' scales run from that value to the square root of the dtype's largest.
    info = np.finfo(dtype)
    base = np.random.default_rng(7).standard_normal(1024)
    if spread == "tiny":
        scales = np.random.default_rng(8).standard_normal(hvd.size()) * float(info.tiny)
    else:
        low, high = float(info.tiny), float(np.sqrt(float(info.max)))
        scales = np.array([high ** ((r + 1) / hvd.size()) * low ** ((hvd.size() - r - 1) / hvd.size())
                           for r in range(hvd.size())])
    vectors = [(base * scale).astype(dtype) for scale in scales]
    got = hvd.allreduce(vectors[hvd.rank()], op=hvd.Adasum, name=f"adasum.ends.{spread}.{np.dtype(dtype).name}")
    want = np.mean([v.astype(np.float64) for v in vectors], axis=0)
    # within a few units in the last place of the dtype, relative to the whole vector
    relative = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
    assert relative < 8 * float(info.eps), (spread, relative)


@pow2
def test_scale_factors_apply_before_and_after() -> None:
    x = rank_vector(hvd.rank(), 50)
    plain = hvd.allreduce(x, op=hvd.Adasum, name="adasum.unscaled")
    scaled = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25,
                           name="adasum.scaled")
    np.testing.assert_allclose(scaled, plain * 0.5, rtol=1e-12)  # Adasum is homogeneous of degree 1


@pytest.mark.skipif(is_power_of_two(SIZE), reason="needs a size that is not a power of two")
def test_non_power_of_two_ranks_raise_horovods_error_on_every_rank() -> None:
    with pytest.raises(NotImplementedError, match=r"Running Adasum with non-power of 2 ranks is not supported yet"):
        hvd.allreduce(np.ones(4), op=hvd.Adasum)
    np.testing.assert_array_equal(hvd.allreduce(np.ones(4), op=hvd.Sum), np.full(4, hvd.size()))


@pytest.mark.min_ranks(2)
def test_a_process_set_or_an_integer_tensor_is_refused() -> None:
    if hvd.rank() == 0:
        with pytest.raises(NotImplementedError, match=r"Adasum does not support non-global process sets yet"):
            hvd.allreduce(np.ones(4), op=hvd.Adasum, process_set=RANK_ZERO)
    if is_power_of_two(hvd.size()):
        with pytest.raises(ValueError, match=r"Adasum combines floating-point tensors .* Got int32"):
            hvd.allreduce(np.ones(4, np.int32), op=hvd.Adasum)
    # nothing was submitted: the job goes on
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, hvd.size()))
