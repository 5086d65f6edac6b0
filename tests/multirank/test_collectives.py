"""Every collective across real processes: dtypes x ops, async and in-place forms, exact numerics."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import unison as hvd

BF16 = np.dtype(ml_dtypes.bfloat16)
REDUCIBLE = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, BF16, np.float32,
             np.float64]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def rank_value(rank: int, dtype: np.dtype, n: int = 6) -> np.ndarray:
    base = (np.arange(n) % 3) + 1  # 1, 2, 3, 1, 2, 3: products stay small for every int type
    return (base * (rank + 1)).astype(dtype)


def expected_reduction(dtype: np.dtype, op: str, size: int, n: int = 6) -> np.ndarray:
    values = np.stack([rank_value(r, dtype, n).astype(np.float64) for r in range(size)])
    result = {"Sum": values.sum(0), "Average": values.sum(0), "Min": values.min(0),
              "Max": values.max(0), "Product": values.prod(0)}[op]
    if np.issubdtype(np.dtype(dtype), np.integer):
        summed = {"Sum": values.sum(0), "Product": values.prod(0)}.get(op, result)
        if op == "Average":  # Horovod: integer sum, then * (1/size) in float64, truncated
            return (values.sum(0).astype(np.int64).astype(dtype).astype(np.float64) * (1.0 / size)).astype(dtype)
        return summed.astype(dtype)
    if op == "Average":
        result = result / size
    return result


def test_topology(world: tuple[int, int]) -> None:
    assert (hvd.rank(), hvd.size()) == world
    assert hvd.local_size() == hvd.size() and hvd.local_rank() == hvd.rank()
    assert (hvd.cross_size(), hvd.cross_rank()) == (1, 0)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: the gloo transport, no MPI
        assert not hvd.mpi_enabled() and hvd.gloo_enabled()
    else:
        assert hvd.is_homogeneous() and hvd.mpi_enabled() and hvd.mpi_threads_supported()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", REDUCIBLE, ids=lambda d: np.dtype(d).name)
def test_allreduce_dtype_op(dtype, op) -> None:
    size = hvd.size()
    x = rank_value(hvd.rank(), dtype)
    out = hvd.allreduce(x, op=OPS[op], name=f"ar.{np.dtype(dtype).name}.{op}")
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    want = expected_reduction(dtype, op, size)
    if np.dtype(dtype) in (np.float16, BF16):
        # reduced in float32 and rounded once: within one half-precision rounding of the exact value
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=2 ** -7)
    else:
        np.testing.assert_array_equal(out.astype(np.float64), np.asarray(want, np.float64))


def _wire_bytes() -> int:
    return int(hvd.statistics().backend["data_bytes"])


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=lambda d: np.dtype(d).name)
def test_half_allreduce_is_the_float32_reduction_rounded_once_for_half_the_bytes(dtype) -> None:
    """float16/bfloat16 cross the wire in 2 bytes, and each element is the float32 sum (in rank
    order) of every rank's prescaled value, postscaled and rounded once: bit for bit, on every rank.
    Sizes split unevenly across ranks; the largest spans several 4 MiB chunks."""
    size, rank = hvd.size(), hvd.rank()
    sizes = [1, 7, 1000, 2_100_003]
    rng = np.random.default_rng(11)
    everyone = [[rng.standard_normal(n).astype(np.float32).astype(dtype) for n in sizes] for _ in range(size)]
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 0.5, 3.0), (hvd.Max, 1.0, 1.0)]:
        name = f"half.{np.dtype(dtype).name}.{op}"
        before = _wire_bytes()
        outs = hvd.grouped_allreduce(everyone[rank], op=op, prescale_factor=pre, postscale_factor=post,
                                     name=name)
        sent = _wire_bytes() - before
        assert sent == 2 * sum(sizes)  # 2-byte values, never widened on the wire
        for i, out in enumerate(outs):
            assert out.dtype == np.dtype(dtype)
            wide = np.stack([everyone[r][i].astype(np.float32) * np.float32(pre) for r in range(size)])
            if op == hvd.Max:
                acc = wide.max(0)
            else:
                acc = wide.sum(0) * np.float32(post / size if op == hvd.Average else post)
            np.testing.assert_array_equal(out.view(np.uint16), acc.astype(dtype).view(np.uint16))
        bits = hvd.allgather(np.concatenate([o.view(np.uint16) for o in outs])[None], name=name + ".bits")
        assert (bits == bits[0]).all(), "ranks disagree on the rounded result"
    x = everyone[rank][2].copy()
    assert hvd.allreduce_(x, op=hvd.Sum, name=f"half.inplace.{np.dtype(dtype).name}") is x
    want = np.stack([everyone[r][2].astype(np.float32) for r in range(size)]).sum(0).astype(dtype)
    np.testing.assert_array_equal(x.view(np.uint16), want.view(np.uint16))


def test_allreduce_scaling_numerics() -> None:
    size = hvd.size()
    x = np.array([1.0, 3.0, -5.0], np.float32) * (hvd.rank() + 1)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scale.f32")
    np.testing.assert_allclose(out, 3.0 * 0.5 * np.array([1.0, 3.0, -5.0]) * size * (size + 1) / 2, rtol=1e-6)
    ints = np.array([3, -3, 7], np.int32)
    out = hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.5, name="scale.i32")
    # each rank's 0.5 * [3, -3, 7] truncates toward zero before the sum: [1, -1, 3]
    np.testing.assert_array_equal(out, np.array([1, -1, 3]) * size)
    out = hvd.allreduce(ints, op=hvd.Average, postscale_factor=2.0, name="scale.avg")
    np.testing.assert_array_equal(out, (np.array([3, -3, 7]) * size * (2.0 / size)).astype(np.int32))


def test_average_is_default_and_average_argument_is_deprecated() -> None:
    x = np.full(3, float(hvd.rank()))
    np.testing.assert_allclose(hvd.allreduce(x, name="default.avg"), (hvd.size() - 1) / 2)
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(x, average=False, name="deprecated.avg")
    np.testing.assert_allclose(out, hvd.size() * (hvd.size() - 1) / 2)
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_async_poll_synchronize_and_in_place() -> None:
    size = hvd.size()
    handles = [hvd.allreduce_async(np.full(100, float(i)), op=hvd.Sum, name=f"async.{i}") for i in range(30)]
    for i, handle in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(100, float(i * size)))
    x = np.ones(1000, np.float64)
    handle = hvd.allreduce_async_(x, op=hvd.Sum, name="inplace")
    while not hvd.poll(handle):
        pass
    assert hvd.synchronize(handle) is x
    np.testing.assert_array_equal(x, np.full(1000, float(size)))
    y = np.ones(4, np.float32)
    assert hvd.allreduce_(y, None, "inplace.positional", hvd.Sum) is y and y[0] == size
    with pytest.raises(ValueError, match="Handle .* was not created or has been cleared"):
        hvd.poll(handle)


def test_scalars_keep_their_shape() -> None:
    size = hvd.size()
    out = hvd.allreduce(np.float32(3), op=hvd.Sum, name="scalar")
    assert out.shape == () and out == 3 * size
    assert hvd.broadcast(np.int64(hvd.rank()), root_rank=0, name="scalar.b").shape == ()
    outs = hvd.grouped_allreduce([np.float64(1), np.ones(2)], op=hvd.Sum, name="scalar.g")
    assert outs[0].shape == () and outs[1].shape == (2,)


def test_unnamed_ops_match_by_call_order() -> None:
    for i in range(5):
        out = hvd.allreduce(np.full(2, float(i)), op=hvd.Sum)
        assert out[0] == i * hvd.size()


def test_an_extra_named_call_does_not_shift_unnamed_names() -> None:
    """Rank 0 submits a named op first; the unnamed op after it must still match across ranks."""
    early = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="early") if hvd.rank() == 0 else None
    assert hvd.allreduce(np.full(2, 1.0), op=hvd.Sum)[0] == hvd.size()  # unnamed
    if early is None:
        early = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="early")
    assert hvd.synchronize(early)[0] == hvd.size()


def test_grouped_allreduce_and_in_place() -> None:
    size = hvd.size()
    tensors = [np.full(shape, float(hvd.rank() + 1), np.float32) for shape in [(3,), (2, 2), (1,), (5, 1)]]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="grouped")
    for t, o in zip(tensors, outs):
        assert o.shape == t.shape
        np.testing.assert_array_equal(o, np.full(t.shape, size * (size + 1) / 2))
    outs = hvd.grouped_allreduce_(tensors, op=hvd.Average, name="grouped.inplace")
    assert all(o is t for o, t in zip(outs, tensors))
    np.testing.assert_allclose(tensors[0], (size + 1) / 2)
    assert hvd.grouped_allreduce([], name="empty") == []


@pytest.mark.parametrize("dtype", REDUCIBLE + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_allgather_varying_first_dimension(dtype) -> None:
    rank, size = hvd.rank(), hvd.size()
    x = np.full((rank + 1, 2, 3), rank % 2 if dtype is np.bool_ else rank, dtype=dtype)
    out = hvd.allgather(x, name=f"ag.{np.dtype(dtype).name}")
    assert out.shape == (size * (size + 1) // 2, 2, 3) and out.dtype == np.dtype(dtype)
    offset = 0
    for r in range(size):
        np.testing.assert_array_equal(out[offset : offset + r + 1], np.full((r + 1, 2, 3), r % 2 if dtype is np.bool_ else r, dtype))
        offset += r + 1


def test_grouped_allgather() -> None:
    rank, size = hvd.rank(), hvd.size()
    outs = hvd.grouped_allgather([np.full((rank + 1,), rank), np.full((1, 2), rank * 10.0)], name="gag")
    assert outs[0].tolist() == [r for r in range(size) for _ in range(r + 1)]
    assert outs[1][:, 0].tolist() == [r * 10.0 for r in range(size)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float16, BF16, np.float64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_broadcast_from_every_root(dtype) -> None:
    for root in range(hvd.size()):
        x = np.full((2, 3), (hvd.rank() + 1) % 2 if dtype is np.bool_ else hvd.rank() + 1, dtype)
        out = hvd.broadcast(x, root_rank=root, name=f"bc.{np.dtype(dtype).name}.{root}")
        want = (root + 1) % 2 if dtype is np.bool_ else root + 1
        np.testing.assert_array_equal(out, np.full((2, 3), want, dtype))
        assert x[0, 0] == np.array((hvd.rank() + 1) % 2 if dtype is np.bool_ else hvd.rank() + 1, dtype)
        y = x.copy()
        assert hvd.broadcast_(y, root, name=f"bc_.{np.dtype(dtype).name}.{root}") is y
        np.testing.assert_array_equal(y, np.full((2, 3), want, dtype))


def test_alltoall_equal_and_explicit_splits() -> None:
    rank, size = hvd.rank(), hvd.size()
    x = np.arange(2 * size, dtype=np.int32) + 100 * rank
    out = hvd.alltoall(x, name="a2a.equal")
    assert out.tolist() == [100 * r + 2 * rank + i for r in range(size) for i in range(2)]
    # rank r sends (i + 1) rows to rank i, each row tagged with (sender, receiver)
    splits = np.arange(1, size + 1, dtype=np.int32)
    rows = np.concatenate([np.full((i + 1, 2), [rank, i]) for i in range(size)])
    out, received = hvd.alltoall(rows, splits=splits, name="a2a.splits")
    assert received.tolist() == [rank + 1] * size
    assert out.tolist() == [[r, rank] for r in range(size) for _ in range(rank + 1)]


@pytest.mark.parametrize("dtype", [np.int32, np.float16, BF16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_reducescatter_uneven_rows(dtype) -> None:
    rank, size = hvd.rank(), hvd.size()
    rows = 2 * size + 1
    x = (np.arange(rows * 2).reshape(rows, 2) + rank).astype(dtype)
    out = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{np.dtype(dtype).name}")
    mine = 3 if rank == 0 else 2  # the first rows % size ranks get one extra row
    start = 0 if rank == 0 else 3 + 2 * (rank - 1)
    total = sum((np.arange(rows * 2).reshape(rows, 2) + r) for r in range(size))
    assert out.shape == (mine, 2) and out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out.astype(np.float64), total[start : start + mine], rtol=1e-3)
    avg = hvd.reducescatter(x, name=f"rs.avg.{np.dtype(dtype).name}")
    want = total[start : start + mine] / size
    if np.issubdtype(dtype, np.integer):
        want = np.trunc(want)
    np.testing.assert_allclose(avg.astype(np.float64), want, rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=lambda d: np.dtype(d).name)
def test_half_reducescatter_sends_2_byte_values_and_rounds_once(dtype) -> None:
    rank, size = hvd.rank(), hvd.size()
    rows = 3 * size + 1
    everyone = [np.random.default_rng(r).standard_normal((rows, 5)).astype(np.float32).astype(dtype)
                for r in range(size)]
    before = _wire_bytes()
    out = hvd.reducescatter(everyone[rank], op=hvd.Average, prescale_factor=0.5, name=f"rs.bits.{dtype}")
    assert _wire_bytes() - before == everyone[rank].nbytes  # never widened on the wire
    start = sum(3 + (1 if r < 1 else 0) for r in range(rank))
    mine = 3 + (1 if rank < 1 else 0)
    wide = np.stack([e[start : start + mine].astype(np.float32) * np.float32(0.5) for e in everyone])
    want = (wide.sum(0) * np.float32(1.0 / size)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def test_grouped_reducescatter_and_op_check() -> None:
    size = hvd.size()
    outs = hvd.grouped_reducescatter([np.ones((size, 2)), np.ones((2 * size,))], op=hvd.Sum, name="grs")
    assert outs[0].tolist() == [[size, size]] and outs[1].tolist() == [size, size]
    with pytest.raises(hvd.HorovodInternalError, match="Reducescatter currently only supports AVERAGE and SUM"):
        hvd.reducescatter(np.ones(size), op=hvd.Max)


def test_join_with_uneven_step_counts() -> None:
    rank, size = hvd.rank(), hvd.size()
    for step in range(rank + 1):  # rank r runs r + 1 steps, then joins
        out = hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name=f"join.step{step}")
        np.testing.assert_array_equal(out, np.full(3, size - step))  # joined ranks add zeros
    assert hvd.join() == size - 1
    # the job goes on normally afterwards
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.join")[0] == size


def test_barrier_and_objects() -> None:
    hvd.barrier()
    obj = {"rank": hvd.rank(), "list": [1, 2, 3]} if hvd.rank() == 0 else None
    assert hvd.broadcast_object(obj, root_rank=0, name="cfg") == {"rank": 0, "list": [1, 2, 3]}
    assert hvd.allgather_object(("r", hvd.rank())) == [("r", r) for r in range(hvd.size())]
    # without names: non-roots pass None, objects differ in type across ranks; call order matches them
    assert hvd.broadcast_object([1, 2] if hvd.rank() == 0 else None) == [1, 2]
    mixed = hvd.allgather_object("text" if hvd.rank() % 2 else 7)
    assert mixed == ["text" if r % 2 else 7 for r in range(hvd.size())]


def test_many_tensors_in_flight_with_mixed_kinds() -> None:
    """Interleave allreduce, allgather and broadcast handles; all complete correctly."""
    size = hvd.size()
    handles = []
    for i in range(20):
        handles.append(("ar", i, hvd.allreduce_async(np.full(7, float(i)), op=hvd.Sum, name=f"mix.ar{i}")))
        handles.append(("ag", i, hvd.allgather_async(np.full((1,), i), name=f"mix.ag{i}")))
        handles.append(("bc", i, hvd.broadcast_async(np.full(2, hvd.rank()), root_rank=i % size, name=f"mix.bc{i}")))
    for kind, i, h in reversed(handles):
        out = hvd.synchronize(h)
        if kind == "ar":
            assert out.tolist() == [i * size] * 7
        elif kind == "ag":
            assert out.tolist() == [i] * size
        else:
            assert out.tolist() == [i % size] * 2
