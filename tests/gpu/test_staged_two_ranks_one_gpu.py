"""Two ranks on one GPU: staged through host memory they work; over NCCL they are named."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tests.gpu.plane_job import entry, fetch, respond, thread_planes
from unison.dtypes import DType
from unison.errors import HorovodInternalError
from unison.ops import CollectiveKind, ReduceOp

AR = CollectiveKind.ALLREDUCE


def run_two(fn: Any) -> list[Any]:
    results: list[Any] = [None, None]

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - returned for the assertions
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.INT32], ids=lambda d: d.value)
def test_staged_allreduce_on_two_ranks_sharing_a_gpu(dtype: DType) -> None:
    planes = thread_planes(2, "mpi")
    x = [np.full(1000, r + 1, dtype=dtype.storage if dtype is not DType.BFLOAT16 else np.float32) for r in range(2)]
    if dtype is DType.BFLOAT16:
        from unison.dtypes import float32_to_bfloat16

        x = [float32_to_bfloat16(a) for a in x]

    def rank_fn(rank: int) -> np.ndarray:
        plane = planes[rank]
        (out,) = plane.run(respond(AR, ["a"], dtype, [(1000,)], reduce_op=ReduceOp.AVERAGE),
                           [entry("a", AR, rank, x[rank], plane.device, dtype, ReduceOp.AVERAGE)])
        return fetch(out)

    results = run_two(rank_fn)
    assert results[0].tolist() == results[1].tolist()
    if dtype is not DType.BFLOAT16:
        np.testing.assert_allclose(results[0].astype(np.float64), 1 if dtype.is_integer else 1.5)


def test_nccl_on_two_ranks_sharing_a_gpu_names_them() -> None:
    planes = thread_planes(2, "nccl")

    def rank_fn(rank: int) -> Any:
        plane = planes[rank]
        return plane.run(respond(AR, ["a"], DType.FLOAT32, [(4,)]),
                         [entry("a", AR, rank, np.ones(4, np.float32), plane.device, DType.FLOAT32)])

    results = run_two(rank_fn)
    for result in results:
        assert isinstance(result, HorovodInternalError)
        assert "Several ranks use the same GPU, which NCCL refuses: ranks [0, 1]" in str(result)
