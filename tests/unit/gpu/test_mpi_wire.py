"""CUDA-aware MPI as the GPU plane's wire (`unison.gpu.mpi_wire`), on fake devices with thread ranks:
the members agree per set, the device-side plan is NCCL's, the host waits for unison's stream before
MPI reads, and anything MPI cannot reduce on the device is staged on every rank alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.unit.gpu.fake_job import (
    array_of,
    check_every_collective,
    device_entry,
    every_collective,
    make_planes,
    respond,
    run_ranks,
)
from unison.dtypes import DType
from unison.gpu.mpi_wire import mpi_can_carry
from unison.gpu.plane import GpuPlane
from unison.ops import CollectiveKind, ReduceOp

AR, AG = CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER
DATA_CALLS = ("allreduce_", "allgatherv", "broadcast_", "alltoallv", "reducescatter")


class LoggingBackend:
    """The rank's backend, with each data-plane call appended to the fake device's log."""

    def __init__(self, backend: Any, device: Any) -> None:
        self._backend, self._device = backend, device

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._backend, name)
        if name not in DATA_CALLS:
            return attribute

        def logged(*args: Any, **kwargs: Any) -> Any:
            self._device.log.append(("mpi." + name, "-", None))
            return attribute(*args, **kwargs)

        return logged


def planes_with(flags: list[bool | None], **kwargs: Any) -> list[GpuPlane]:
    planes = make_planes(len(flags), operations="mpi", cuda_aware_mpi=flags, **kwargs)
    for plane in planes:
        plane.backend = LoggingBackend(plane.backend, plane.device)  # type: ignore[assignment]
    return planes


@pytest.mark.parametrize("size", [2, 3])
def test_every_member_cuda_aware_runs_on_the_device_buffers(size: int) -> None:
    planes = planes_with([True] * size)
    check_every_collective(run_ranks(size, lambda rank: every_collective(planes[rank], rank, size)))
    for plane in planes:
        stats = plane.statistics()
        assert stats["mpi_direct_responses"] == 6 and stats["staged_responses"] == 0
        assert "to_host" not in plane.device.operations()  # type: ignore[attr-defined]
    # the fused allreduce: packed with the prescale, the host waits for unison's stream, MPI reduces
    # the fusion buffer, the postscale and the unpack are queued after it
    log = planes[0].device.operations("pack", "synchronize", "mpi.allreduce_", "scale", "unpack")  # type: ignore[attr-defined]
    assert log[:5] == ["pack", "synchronize", "mpi.allreduce_", "scale", "unpack"]
    # every MPI data call comes right after a wait for the stream (the agreement is the first call)
    ops = planes[0].device.operations()  # type: ignore[attr-defined]
    calls = [i for i, op in enumerate(ops) if op.startswith("mpi.")]
    assert ops[calls[0]] == "mpi.allgatherv" and all(ops[i - 1] == "synchronize" for i in calls[1:])


def test_one_member_without_cuda_aware_mpi_stages_the_set_on_every_member() -> None:
    planes = planes_with([True, False, True])
    check_every_collective(run_ranks(3, lambda rank: every_collective(planes[rank], rank, 3)))
    for plane in planes:
        stats = plane.statistics()
        assert stats["mpi_direct_responses"] == 0 and stats["staged_responses"] == 6
    assert repr(planes[0]._mpi_comms.get(0, 0, (0, 1, 2), 0)).endswith("staged (ranks [1] not CUDA-aware)>")


def test_without_an_mpi_backend_everything_is_staged_and_nothing_is_agreed() -> None:
    planes = planes_with([None, None])
    check_every_collective(run_ranks(2, lambda rank: every_collective(planes[rank], rank, 2)))
    for plane in planes:
        assert plane.statistics()["staged_responses"] == 6
        assert plane._mpi_comms.statistics()["made"] == 0


def test_what_mpi_cannot_reduce_on_the_device_is_staged_without_asking() -> None:
    assert not mpi_can_carry(respond(AR, ["h"], DType.FLOAT16, [(2,)]))
    assert not mpi_can_carry(respond(AR, ["h"], DType.BFLOAT16, [(2,)]))
    assert not mpi_can_carry(respond(AR, ["t"], DType.BOOL, [(2,)]))
    assert not mpi_can_carry(respond(AR, ["g"], DType.FLOAT32, [(2,)], reduce_op=ReduceOp.ADASUM))
    assert mpi_can_carry(respond(AR, ["s"], DType.INT16, [(2,)]))  # NCCL has no int16; MPI does
    assert mpi_can_carry(respond(AG, ["h"], DType.FLOAT16, [(2,)]))  # moving bytes needs no MPI type
    planes = planes_with([True, True])
    half = np.array([1.5, -2.0], np.float16)

    def rank_fn(rank: int) -> np.ndarray:
        (out,) = planes[rank].run(respond(AR, ["h"], DType.FLOAT16, [(2,)]),
                                  [device_entry("h", AR, rank, half.view(np.uint16).view(np.float16), dtype=DType.FLOAT16)])
        return array_of(out)

    for got in run_ranks(2, rank_fn):
        np.testing.assert_array_equal(np.asarray(got).view(np.float16), 2 * half)
    assert planes[0].statistics()["staged_responses"] == 1
    assert planes[0]._mpi_comms.statistics()["made"] == 0  # no agreement for a response MPI cannot carry


def test_the_agreement_is_per_set_and_redone_when_a_set_changes() -> None:
    planes = planes_with([True, True, False], process_sets={0: (0, 1, 2), 1: (0, 1)})
    x = np.ones(2, np.float32)

    def allreduce(rank: int, set_id: int) -> np.ndarray:
        entry = device_entry("a", AR, rank, x, dtype=DType.FLOAT32, set_id=set_id)
        return array_of(planes[rank].run(respond(AR, ["a"], DType.FLOAT32, [(2,)], process_set_id=set_id),
                                         [entry])[0])

    assert all((r == 3).all() for r in run_ranks(3, lambda rank: allreduce(rank, 0)))  # rank 2 says no: staged
    assert all((r == 2).all() for r in run_ranks(2, lambda rank: allreduce(rank, 1)))  # ranks 0 and 1: direct
    assert [p.statistics()["mpi_direct_responses"] for p in planes] == [1, 1, 0]
    for plane in planes:  # set 1 removed and its id reused for ranks 1 and 2
        plane.process_sets[1] = (1, 2)
        plane.backend._backend.group._sets[1] = ((1, 2), type(plane.backend._backend.group._sets[0][1])(2))  # type: ignore[attr-defined]
    assert all((r == 2).all() for r in run_ranks(2, lambda i: allreduce((1, 2)[i], 1)))
    assert [p.statistics()["mpi_direct_responses"] for p in planes] == [1, 1, 0]  # agreed again: staged now
    assert planes[1]._mpi_comms.statistics()["made"] == 3
