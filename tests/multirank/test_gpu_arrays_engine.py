"""GPU arrays through the NumPy-style API and the real engine, on a fake device (no GPU needed).

A stand-in ``cupy`` module whose arrays are NumPy arrays marked with ``__cuda_array_interface__``
makes `unison` take its GPU route end to end: `prepare_arrays`, negotiation with ``device="cuda"``,
the executor's GPU plane (built by `create_device_plane` on the bound `FakeDevice`), the results'
stream rule. ``UNISON_GPU_OPERATIONS=mpi`` is set for the module; the plane uses CUDA-aware MPI on
the "device" buffers (the MPI library's answer is replaced by yes, which is safe here: the buffers
are host memory), under either controller, since the gRPC controller's data plane is MPI too.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

import unison as hvd
from unison.errors import InvalidArgumentError
from unison.gpu import build, handoff
from unison.gpu.fake import FakeDevice


class GpuArray(np.ndarray):
    """A NumPy array that says it lives on a GPU."""

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ctypes.data, False), "version": 3}


def gpu(values: object, dtype: object = np.float32) -> GpuArray:
    return np.ascontiguousarray(np.asarray(values, dtype=dtype)).view(GpuArray)


@pytest.fixture(scope="module", autouse=True)
def job():
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.ndarray = np.ndarray  # type: ignore[attr-defined]
    fake_cupy.ascontiguousarray = np.ascontiguousarray  # type: ignore[attr-defined]
    fake_cupy.empty_like = np.empty_like  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("cupy",)}
    saved_env = os.environ.get("UNISON_GPU_OPERATIONS")
    saved_query = build.cuda_aware_mpi
    sys.modules["cupy"] = fake_cupy
    os.environ["UNISON_GPU_OPERATIONS"] = "mpi"
    build.cuda_aware_mpi = lambda mpi, load_library=None: True  # type: ignore[assignment]
    try:
        hvd.init()
        try:
            handoff.device_for(0, make=lambda ordinal: FakeDevice(ordinal))  # this rank's "GPU"
            yield
        finally:
            hvd.shutdown()
    finally:  # the later modules of this pytest process see none of it
        handoff.reset()
        build.cuda_aware_mpi = saved_query  # type: ignore[assignment]
        if saved_env is None:
            os.environ.pop("UNISON_GPU_OPERATIONS", None)
        else:
            os.environ["UNISON_GPU_OPERATIONS"] = saved_env
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _plane_statistics() -> dict[str, int]:
    from unison._job.runtime import job as current

    plane = current().engine.executor.device_plane
    assert plane is not None, "the GPU route was not taken"
    return plane.statistics()


def test_allreduce_allgather_broadcast_and_reducescatter() -> None:
    rank, size = hvd.rank(), hvd.size()
    np.testing.assert_allclose(hvd.allreduce(gpu([1.0, 2.0]) * (rank + 1), op=hvd.Sum, name="ar"),
                               np.array([1.0, 2.0]) * size * (size + 1) / 2)
    a, b = hvd.grouped_allreduce([gpu([rank] * 3), gpu([[2.0 * rank]])], name="grouped")
    np.testing.assert_allclose(a, [(size - 1) / 2] * 3)
    np.testing.assert_allclose(b, [[size - 1.0]])
    gathered = hvd.allgather(gpu(np.full((rank + 1, 2), rank), np.int32), name="ag")
    np.testing.assert_array_equal(gathered, np.concatenate([np.full((r + 1, 2), r) for r in range(size)]))
    np.testing.assert_array_equal(hvd.broadcast(gpu([rank, rank], np.int64), root_rank=size - 1, name="bc"),
                                  [size - 1] * 2)
    scattered = hvd.reducescatter(gpu(np.arange(2 * size).reshape(size, 2)) * (rank + 1), op=hvd.Sum, name="rs")
    total = np.arange(2 * size).reshape(size, 2) * size * (size + 1) / 2
    np.testing.assert_allclose(scattered, total[rank : rank + 1])
    stats = _plane_statistics()
    assert stats["responses"] >= 5
    if hvd.gloo_enabled():  # torchrun: no MPI to hand device buffers to, staged over gloo
        assert stats["staged_responses"] > 0 and stats["mpi_direct_responses"] == 0
    else:
        assert stats["mpi_direct_responses"] > 0  # the gRPC controller's data plane is MPI too


def test_alltoall_with_and_without_splits() -> None:
    rank, size = hvd.rank(), hvd.size()
    before = _plane_statistics()["responses"]
    even = gpu(np.arange(size * 2).reshape(size, 2) + 100 * rank)
    out = hvd.alltoall(even, name="a2a.even")
    np.testing.assert_array_equal(out, np.stack([np.arange(size * 2).reshape(size, 2)[rank] + 100 * s
                                                 for s in range(size)]))
    # rank r sends r + 1 rows to every rank, from a tensor one row longer than that (not sent)
    rows = np.arange((size * (rank + 1) + 1) * 2).reshape(-1, 2) + 1000 * rank
    out, received = hvd.alltoall(gpu(rows), splits=[rank + 1] * size, name="a2a.splits")
    assert received.tolist() == [s + 1 for s in range(size)]
    expected = [(np.arange((size * (s + 1) + 1) * 2).reshape(-1, 2) + 1000 * s)[rank * (s + 1) : (rank + 1) * (s + 1)]
                for s in range(size)]
    np.testing.assert_array_equal(out, np.concatenate(expected))
    assert _plane_statistics()["responses"] == before + 2  # both went to the GPU plane


def test_bad_splits_on_a_gpu_array_are_refused_before_any_rank_waits() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Sum of splits entries is greater than the first dimension"):
        hvd.alltoall(gpu(np.zeros((2, 2))), splits=[3] * hvd.size(), name="a2a.bad")
