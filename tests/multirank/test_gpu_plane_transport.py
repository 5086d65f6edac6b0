"""The GPU data plane's MPI wire on the job's real transport, with fake devices (NumPy arrays as device memory).

Each rank builds a second backend of the configured kind beside the engine's (as the backend contract
test does) and a `GpuPlane` with ``operations="mpi"`` on a `FakeDevice`. The fused buffers, raw views
and slices the plane hands to CUDA-aware MPI go through mpi4py's real calls (the gRPC controller's
data plane is MPI too; a loopback backend, which cannot take device buffers, stages). Then one rank
says its MPI is not CUDA-aware and every rank stages, with the same results.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

import unison as hvd
from tests.unit.gpu.fake_job import check_every_collective, every_collective
from unison.backends import create_backend
from unison.config import load_settings
from unison.gpu.fake import FakeDevice
from unison.gpu.mpi_wire import MPI_DATA_PLANES
from unison.gpu.plane import GpuPlane


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture()
def backend():
    settings = load_settings()
    made = create_backend(settings.controller, MPI.COMM_WORLD, settings, local_size=hvd.local_size())
    yield made
    made.close()


def _run(backend, cuda_aware: bool | None) -> dict[str, int]:
    rank, size = backend.rank, backend.size
    plane = GpuPlane(backend, rank, {0: tuple(range(size))}, FakeDevice(rank, f"0000:{rank + 1:02x}:00.0"), None,
                     operations="mpi", cuda_aware_mpi=cuda_aware, host="node")
    mine = every_collective(plane, rank, size)
    everyone = MPI.COMM_WORLD.allgather(mine)
    check_every_collective(everyone)
    stats = plane.statistics()
    plane.close()
    return stats


def test_cuda_aware_mpi_carries_the_device_buffers(backend) -> None:
    direct = backend.name in MPI_DATA_PLANES
    stats = _run(backend, True if direct else None)
    assert stats["mpi_direct_responses"] == (6 if direct else 0)
    assert stats["staged_responses"] == (0 if direct else 6)


def test_one_rank_without_cuda_aware_mpi_stages_on_every_rank(backend) -> None:
    if backend.name not in MPI_DATA_PLANES:
        pytest.skip("only an MPI data plane can take device buffers")
    stats = _run(backend, backend.rank != backend.size - 1)
    assert stats["mpi_direct_responses"] == 0 and stats["staged_responses"] == 6
