"""Every collective and dtype through NCCL (and staged) on one GPU, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.plane_job import as_float, entry, fetch, host_values, respond, single_plane
from unison.dtypes import DType
from unison.ops import CollectiveKind, ReduceOp

AR, AG, BC, A2A, RS = (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER, CollectiveKind.BROADCAST,
                       CollectiveKind.ALLTOALL, CollectiveKind.REDUCESCATTER)
DTYPES = [DType.UINT8, DType.INT8, DType.INT32, DType.INT64, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32,
          DType.FLOAT64]


@pytest.mark.parametrize("operations", ["nccl", "mpi"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_every_collective(dtype: DType, operations: str) -> None:
    plane = single_plane(operations)
    device = plane.device
    x = host_values(dtype, np.arange(1, 13).reshape(4, 3))
    (out,) = plane.run(respond(AR, ["a"], dtype, [x.shape], prescale=2.0, postscale=1.5),
                       [entry("a", AR, 0, x, device, dtype)])
    expected = np.trunc(as_float(x, dtype) * 3.0) if dtype.is_integer else as_float(x, dtype) * 3.0
    np.testing.assert_allclose(as_float(fetch(out), dtype), expected, rtol=1e-2)
    for op in (ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        (out,) = plane.run(respond(AR, ["o"], dtype, [x.shape], reduce_op=op), [entry("o", AR, 0, x, device, dtype, op)])
        np.testing.assert_array_equal(fetch(out), x)
    fused = plane.run(respond(AR, ["f1", "f2"], dtype, [x.shape, (3,)]),
                      [entry("f1", AR, 0, x, device, dtype), entry("f2", AR, 0, x[0], device, dtype)])
    np.testing.assert_array_equal(fetch(fused[0]), x)
    np.testing.assert_array_equal(fetch(fused[1]), x[0])
    (out,) = plane.run(respond(AG, ["g"], dtype, [x.shape], sizes=((4,),)), [entry("g", AG, 0, x, device, dtype)])
    np.testing.assert_array_equal(fetch(out), x)
    (out,) = plane.run(respond(BC, ["b"], dtype, [x.shape], root_rank=0), [entry("b", BC, 0, x, device, dtype)])
    np.testing.assert_array_equal(fetch(out), x)
    ((out, received),) = plane.run(respond(A2A, ["t"], dtype, [x.shape], sizes=(((4,),),)),
                                   [entry("t", A2A, 0, x, device, dtype)])
    np.testing.assert_array_equal(fetch(out), x)
    assert received.tolist() == [4]
    (out,) = plane.run(respond(RS, ["r"], dtype, [x.shape], prescale=2.0), [entry("r", RS, 0, x, device, dtype)])
    np.testing.assert_allclose(as_float(fetch(out), dtype), as_float(x, dtype) * 2)
    staged = plane.statistics()["staged_responses"]
    assert staged == (0 if operations == "nccl" else plane.statistics()["responses"])


def test_large_fused_buffer_is_reused() -> None:
    plane = single_plane()
    device = plane.device
    parts = [np.random.default_rng(i).standard_normal(1 << 16).astype(np.float32) for i in range(8)]
    for _ in range(3):
        results = plane.run(respond(AR, [f"p{i}" for i in range(8)], DType.FLOAT32, [p.shape for p in parts],
                                    reduce_op=ReduceOp.AVERAGE),
                            [entry(f"p{i}", AR, 0, p, device, DType.FLOAT32) for i, p in enumerate(parts)])
    for part, result in zip(parts, results):
        np.testing.assert_array_equal(fetch(result), part)
    assert plane.statistics()["fusion_buffer_bytes"] == 8 * 4 * (1 << 16)
    assert plane.statistics()["communicators_made"] == 1
