"""The GPU data plane on fake devices: every collective and dtype against NumPy, over NCCL and staged."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tests.unit.gpu.fake_job import A2A, AG, AR, BC, RS, device_entry, make_planes, respond, run_ranks
from tests.unit.gpu.fake_job import array_of as result_array
from unison.dtypes import DType, bfloat16_to_float32, float32_to_bfloat16
from unison.errors import HorovodInternalError
from unison.gpu.fake import FakeLibrary
from unison.gpu.plane import GpuPlane, uses_nccl
from unison.ops import ReduceOp

DTYPES = [DType.UINT8, DType.INT8, DType.INT32, DType.INT64, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32,
          DType.FLOAT64]
OPERATIONS = ["nccl", "mpi"]


def values(dtype: DType, numbers: Any) -> np.ndarray:
    """`numbers` in the storage dtype (bfloat16 as bits)."""
    array = np.asarray(numbers, dtype=np.float32)
    if dtype is DType.BFLOAT16:
        return float32_to_bfloat16(array.reshape(-1)).reshape(array.shape)
    return array.astype(dtype.storage)


def as_float(array: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.BFLOAT16:
        return bfloat16_to_float32(np.ascontiguousarray(array).reshape(-1)).reshape(array.shape)
    return np.asarray(array, dtype=np.float64)


@pytest.mark.parametrize("operations", OPERATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_every_collective_on_one_rank(dtype: DType, operations: str) -> None:
    (plane,) = make_planes(1, operations=operations)
    x = values(dtype, [[1, 2, 3], [4, 5, 6]])
    # allreduce, Sum with a prescale of 2 and a postscale of 1.5 (integers truncated, as Horovod)
    entry = device_entry("a", AR, 0, x, dtype=dtype)
    (out,) = plane.run(respond(AR, ["a"], dtype, [x.shape], prescale=2.0, postscale=1.5), [entry])
    expected = np.trunc(as_float(x, dtype) * 2.0 * 1.5) if dtype.is_integer else as_float(x, dtype) * 3.0
    np.testing.assert_allclose(as_float(result_array(out), dtype), expected)
    # Average of one rank is the value itself
    entry = device_entry("b", AR, 0, x, dtype=dtype, op=ReduceOp.AVERAGE)
    (out,) = plane.run(respond(AR, ["b"], dtype, [x.shape], reduce_op=ReduceOp.AVERAGE), [entry])
    np.testing.assert_array_equal(result_array(out), x)
    # allgather, broadcast, alltoall, reducescatter
    (out,) = plane.run(respond(AG, ["c"], dtype, [x.shape], sizes=((2,),)), [device_entry("c", AG, 0, x, dtype=dtype)])
    np.testing.assert_array_equal(result_array(out), x)
    (out,) = plane.run(respond(BC, ["d"], dtype, [x.shape], root_rank=0), [device_entry("d", BC, 0, x, dtype=dtype)])
    np.testing.assert_array_equal(result_array(out), x)
    ((out, received),) = plane.run(respond(A2A, ["e"], dtype, [x.shape], sizes=(((2,),),)),
                                   [device_entry("e", A2A, 0, x, dtype=dtype)])
    np.testing.assert_array_equal(result_array(out), x)
    assert received.tolist() == [2]
    (out,) = plane.run(respond(RS, ["f"], dtype, [x.shape]), [device_entry("f", RS, 0, x, dtype=dtype)])
    np.testing.assert_array_equal(result_array(out), x)
    assert plane.statistics()["staged_responses"] == (6 if operations == "mpi" else 0)


REFERENCE = {ReduceOp.SUM: np.sum, ReduceOp.AVERAGE: np.mean, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max,
             ReduceOp.PRODUCT: np.prod}


@pytest.mark.parametrize("operations", OPERATIONS)
@pytest.mark.parametrize("op", list(REFERENCE), ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [DType.INT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32], ids=lambda d: d.value)
@pytest.mark.parametrize("tensors", [1, 3], ids=["single", "fused"])
def test_allreduce_on_two_ranks_matches_numpy(dtype: DType, op: ReduceOp, operations: str, tensors: int) -> None:
    planes = make_planes(2, operations=operations)
    data = [[values(dtype, np.arange(4 * (t + 1)).reshape(-1, 2) % 5 + rank + 1) for t in range(tensors)]
            for rank in range(2)]

    def rank_fn(rank: int) -> list[Any]:
        entries = [device_entry(f"t{t}", AR, rank, data[rank][t], dtype=dtype, op=op) for t in range(tensors)]
        response = respond(AR, [f"t{t}" for t in range(tensors)], dtype, [a.shape for a in data[0]], reduce_op=op)
        return [result_array(r) for r in planes[rank].run(response, entries)]

    results = run_ranks(2, rank_fn)
    for t in range(tensors):
        expected = REFERENCE[op](np.stack([as_float(data[r][t], dtype) for r in range(2)]), axis=0)
        if dtype.is_integer and op is ReduceOp.AVERAGE:
            expected = np.trunc(expected)
        for rank in range(2):
            np.testing.assert_allclose(as_float(results[rank][t], dtype), expected, rtol=1e-2)
    assert planes[0].statistics()["fused_responses"] == (1 if tensors > 1 and operations == "nccl" else 0)


@pytest.mark.parametrize("operations", OPERATIONS)
def test_uneven_gathers_alltoall_reducescatter_and_broadcast_on_two_ranks(operations: str) -> None:
    planes = make_planes(2, operations=operations)
    dtype = DType.FLOAT32
    gathered = [np.full((1, 2), 1.0, np.float32), np.full((3, 2), 2.0, np.float32)]
    matrix = ((1, 2), (0, 3))  # row = sender: rank 0 sends 1 row to itself, 2 to rank 1; rank 1 sends 3 to itself
    sends = [np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(6, 12, dtype=np.float32).reshape(3, 2)]
    scatter = [np.arange(10, dtype=np.float32).reshape(5, 2) * (r + 1) for r in range(2)]

    def rank_fn(rank: int) -> dict[str, Any]:
        plane = planes[rank]
        (ag,) = plane.run(respond(AG, ["g"], dtype, [(1, 2)], sizes=((1, 3),)),
                          [device_entry("g", AG, rank, gathered[rank], dtype=dtype)])
        bcast_in = np.full(4, float(rank + 7), np.float32)
        (bc,) = plane.run(respond(BC, ["b"], dtype, [(4,)], root_rank=1),
                          [device_entry("b", BC, rank, bcast_in, dtype=dtype)])
        ((a2a, received),) = plane.run(respond(A2A, ["x"], dtype, [(3, 2)], sizes=(matrix,)),
                                       [device_entry("x", A2A, rank, sends[rank], dtype=dtype)])
        (rs,) = plane.run(respond(RS, ["r"], dtype, [(5, 2)], reduce_op=ReduceOp.AVERAGE),
                          [device_entry("r", RS, rank, scatter[rank], dtype=dtype, op=ReduceOp.AVERAGE)])
        return {"ag": result_array(ag), "bc": result_array(bc), "a2a": result_array(a2a),
                "received": received.tolist(), "rs": result_array(rs)}

    results = run_ranks(2, rank_fn)
    mean = (scatter[0] + scatter[1]) / 2
    for rank, got in enumerate(results):
        np.testing.assert_array_equal(got["ag"], np.concatenate(gathered))
        np.testing.assert_array_equal(got["bc"], np.full(4, 8.0))
        np.testing.assert_allclose(got["rs"], mean[:3] if rank == 0 else mean[3:])
    np.testing.assert_array_equal(results[0]["a2a"], sends[0][:1])
    assert results[0]["received"] == [1, 0] and results[1]["received"] == [2, 3]
    np.testing.assert_array_equal(results[1]["a2a"], np.concatenate([sends[0][1:], sends[1]]))


def test_a_joined_rank_contributes_zeros() -> None:
    planes = make_planes(2)
    a, b = np.ones(3, np.float32), np.full(2, 5.0, np.float32)

    def rank_fn(rank: int) -> list[Any]:
        entries = [device_entry("a", AR, 0, a, dtype=DType.FLOAT32),
                   device_entry("b", AR, 0, b, dtype=DType.FLOAT32)] if rank == 0 else [None, None]
        return planes[rank].run(respond(AR, ["a", "b"], DType.FLOAT32, [(3,), (2,)]), entries)

    results = run_ranks(2, rank_fn)
    np.testing.assert_array_equal(result_array(results[0][0]), a)
    np.testing.assert_array_equal(result_array(results[0][1]), b)
    assert results[1] == [None, None]


def test_responses_nccl_cannot_carry_are_staged_on_every_rank() -> None:
    assert not uses_nccl(respond(AR, ["a"], DType.INT16, [(2,)]), "nccl")
    assert not uses_nccl(respond(AR, ["a"], DType.FLOAT32, [(2,)], reduce_op=ReduceOp.ADASUM), "nccl")
    assert uses_nccl(respond(AG, ["a"], DType.INT16, [(2,)]), "nccl")  # moving bytes needs no NCCL type
    assert not uses_nccl(respond(AG, ["a"], DType.FLOAT32, [(2,)]), "mpi")
    planes = make_planes(2)
    x = np.array([1, -2, 3], np.int16)
    results = run_ranks(2, lambda rank: result_array(planes[rank].run(
        respond(AR, ["s"], DType.INT16, [(3,)]), [device_entry("s", AR, rank, x, dtype=DType.INT16)])[0]))
    np.testing.assert_array_equal(results[0], 2 * x)
    assert planes[0].statistics()["staged_responses"] == 1 and planes[0].statistics()["communicators"] == 0


def test_one_communicator_per_set_made_again_after_the_set_changes() -> None:
    library = FakeLibrary()
    planes = make_planes(3, library=library, process_sets={0: (0, 1, 2), 1: (0, 2)})
    x = np.ones(2, np.float32)

    def allreduce(rank: int, set_id: int) -> np.ndarray:
        entry = device_entry("a", AR, rank, x, dtype=DType.FLOAT32, set_id=set_id)
        return result_array(planes[rank].run(respond(AR, ["a"], DType.FLOAT32, [(2,)], process_set_id=set_id),
                                             [entry])[0])

    for _ in range(2):
        assert all((r == 3).all() for r in run_ranks(3, lambda rank: allreduce(rank, 0)))
    assert all((r == 2).all() for r in run_ranks(2, lambda i: allreduce((0, 2)[i], 1)))
    assert library.connected == 3 + 2
    assert planes[0].statistics()["communicators"] == 2
    for plane in planes:  # set 1 removed and its id reused for other ranks: a new communicator
        plane.process_sets[1] = (0, 1)
        plane.backend.group._sets[1] = ((0, 1), type(plane.backend.group._sets[0][1])(2))  # type: ignore[attr-defined]
    assert all((r == 2).all() for r in run_ranks(2, lambda rank: allreduce(rank, 1)))
    assert library.connected == 3 + 2 + 2
    planes[0].close()
    assert planes[0].statistics()["communicators"] == 0
    with pytest.raises(HorovodInternalError, match="closed"):
        planes[0].run(respond(AR, ["a"], DType.FLOAT32, [(2,)]), [device_entry("a", AR, 0, x, dtype=DType.FLOAT32)])


def test_two_ranks_on_one_gpu_are_named_on_every_rank_and_staging_still_works() -> None:
    x = np.ones(2, np.float32)

    def allreduce(planes: list[GpuPlane], rank: int) -> Any:
        try:
            return planes[rank].run(respond(AR, ["a"], DType.FLOAT32, [(2,)]),
                                    [device_entry("a", AR, rank, x, dtype=DType.FLOAT32)])
        except HorovodInternalError as exc:
            return str(exc)

    shared = make_planes(2, bus_ids=["0000:17:00.0", "0000:17:00.0"])
    texts = run_ranks(2, lambda rank: allreduce(shared, rank))
    assert texts[0] == texts[1]
    assert texts[0].startswith("Several ranks use the same GPU, which NCCL refuses: ranks [0, 1] on node (0000:17:00.0)")
    assert "rank 1: node cuda:1 (0000:17:00.0)  <- shared with rank 0" in texts[0]
    assert "UNISON_GPU_OPERATIONS=MPI" in texts[0]
    staged = make_planes(2, operations="mpi", bus_ids=["0000:17:00.0", "0000:17:00.0"])
    results = run_ranks(2, lambda rank: allreduce(staged, rank))
    np.testing.assert_array_equal(result_array(results[1][0]), 2 * x)


class _FailingLibrary(FakeLibrary):
    def __init__(self, broken_rank: int | None, block_seconds: float = 0.0) -> None:
        super().__init__()
        self.broken_rank = broken_rank
        self.block_seconds = block_seconds
        self.release = threading.Event()

    def connect(self, unique_id: bytes, size: int, index: int, device: Any = None) -> Any:
        if index == self.broken_rank:
            raise RuntimeError("NCCL error: unhandled system error")
        if self.block_seconds:
            self.release.wait(self.block_seconds)
        return super().connect(unique_id, size, index, device)


def _errors(planes: list[GpuPlane]) -> list[str]:
    def rank_fn(rank: int) -> str:
        with pytest.raises(HorovodInternalError) as info:
            planes[rank].run(respond(AR, ["a"], DType.FLOAT32, [(2,)]),
                             [device_entry("a", AR, rank, np.ones(2, np.float32), dtype=DType.FLOAT32)])
        return str(info.value)

    return run_ranks(len(planes), rank_fn)


def test_a_rank_whose_nccl_setup_fails_is_named_on_every_rank() -> None:
    texts = _errors(make_planes(3, library=_FailingLibrary(broken_rank=1), init_timeout_seconds=2.0))
    for text in texts:
        assert text.startswith("NCCL could not set up the GPU communicator of process set 0 (ranks [0, 1, 2]): "
                               "ranks [1] failed in ncclCommInitRank")
    assert texts[1].endswith("On rank 1: RuntimeError: NCCL error: unhandled system error")


def test_a_setup_that_does_not_finish_is_bounded() -> None:
    library = _FailingLibrary(broken_rank=None, block_seconds=30.0)
    texts = _errors(make_planes(2, library=library, init_timeout_seconds=0.3))
    library.release.set()
    assert texts[0] == texts[1]
    assert texts[0].startswith("NCCL did not set up the GPU communicator of process set 0 (ranks [0, 1]) within "
                               "0.3 s: every rank waited in ncclCommInitRank")


def test_a_host_buffer_in_a_device_response_is_refused() -> None:
    (plane,) = make_planes(1)
    entry = device_entry("a", AR, 0, np.ones(2, np.float32), dtype=DType.FLOAT32)
    entry.input = np.ones(2, np.float32)  # type: ignore[assignment]
    with pytest.raises(HorovodInternalError, match="negotiated for device 'cuda' but this rank submitted a host buffer"):
        plane.run(respond(AR, ["a"], DType.FLOAT32, [(2,)]), [entry])


def test_unknown_operations_are_refused() -> None:
    with pytest.raises(ValueError, match=r"GPU operations must be one of \['nccl', 'mpi'\]. Got 'gloo'"):
        make_planes(1, operations="gloo")
