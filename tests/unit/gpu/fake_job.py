"""A job of GPU data planes on fake devices: ranks as threads, the host plane in memory, NCCL faked."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unison.backends.loopback import ThreadGroup
from unison.dtypes import DType
from unison.engine.handles import Entry, Handle
from unison.gpu.device import DeviceBuffer
from unison.gpu.fake import FakeDevice, FakeLibrary
from unison.gpu.plane import GpuPlane
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.messages import Request, Response


class DeviceContext:
    """``cupy.cuda.Device(ordinal)`` for stand-in CuPy modules: a context that does nothing."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def make_planes(size: int, *, operations: str = "nccl", bus_ids: Sequence[str] | None = None,
                library: Any = None, init_timeout_seconds: float = 10.0,
                process_sets: dict[int, tuple[int, ...]] | None = None,
                cuda_aware_mpi: Sequence[bool | None] | None = None) -> list[GpuPlane]:
    """One plane per rank, each on its own fake device, sharing one thread group and fake NCCL.

    `cuda_aware_mpi[rank]` is what that rank's MPI library answers (None: a backend that cannot take
    device buffers); by default every rank stages.
    """
    group = ThreadGroup(size)
    library = library if library is not None else FakeLibrary()
    sets = process_sets if process_sets is not None else {0: tuple(range(size))}
    planes = []
    for rank in range(size):
        bus_id = bus_ids[rank] if bus_ids is not None else f"0000:{rank + 1:02x}:00.0"
        backend = group.backend(rank)
        for set_id, members in sets.items():
            if set_id != 0:
                backend.add_process_set(set_id, members)
        planes.append(GpuPlane(backend, rank, dict(sets), FakeDevice(rank, bus_id),
                               library if operations == "nccl" else None, operations=operations,
                               init_timeout_seconds=init_timeout_seconds, host="node",
                               cuda_aware_mpi=None if cuda_aware_mpi is None else cuda_aware_mpi[rank]))
    return planes


def run_ranks(size: int, fn: Callable[[int], Any], timeout_seconds: float = 30.0) -> list[Any]:
    """Run ``fn(rank)`` on `size` threads; return the results in rank order, or raise the first error."""
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors[rank] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_seconds)
        assert not thread.is_alive(), "a rank thread hung"
    for error in errors:
        if error is not None:
            raise error
    return results


def device_entry(name: str, kind: CollectiveKind, rank: int, array: np.ndarray, *, dtype: DType,
                 op: ReduceOp = ReduceOp.SUM, in_place: bool = False, ready: Any = None,
                 set_id: int = 0) -> Entry:
    """An entry as the adapters submit it: DeviceBuffers in, an output buffer for allreduce/broadcast."""
    request = Request(name, kind, rank, dtype, tuple(array.shape), op, process_set_id=set_id, device="cuda")
    source = DeviceBuffer(array, ready, rank)
    output = None
    if kind in (CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST):
        output = source if in_place else DeviceBuffer(np.zeros_like(array), ready, rank)
    return Entry(request, source, output, Handle(name))


def array_of(result: Any) -> np.ndarray:
    assert isinstance(result, DeviceBuffer) and result.ready is not None
    return np.asarray(result.array)


AR, AG, BC, A2A, RS = (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER, CollectiveKind.BROADCAST,
                       CollectiveKind.ALLTOALL, CollectiveKind.REDUCESCATTER)


def respond(kind: CollectiveKind, names: list[str], dtype: DType, shapes: list[tuple[int, ...]], **kw: Any) -> Response:
    return Response(kind.value, tuple(names), dtype, tuple(shapes), device="cuda", **kw)


def every_collective(plane: GpuPlane, rank: int, size: int) -> dict[str, Any]:
    """A fused Average allreduce with scaling, an int32 Min, an uneven gather, a broadcast, an alltoall and
    an uneven reducescatter, as `size` ranks run them."""
    f32 = DType.FLOAT32
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + rank
    b = np.full(4, 2.0 * (rank + 1), np.float32)
    fused = plane.run(respond(AR, ["a", "b"], f32, [(2, 3), (4,)], reduce_op=ReduceOp.AVERAGE, prescale=2.0,
                              postscale=0.5),
                      [device_entry("a", AR, rank, a, dtype=f32, op=ReduceOp.AVERAGE),
                       device_entry("b", AR, rank, b, dtype=f32, op=ReduceOp.AVERAGE)])
    i = np.array([5 - rank, rank, 7], np.int32)
    (low,) = plane.run(respond(AR, ["i"], DType.INT32, [(3,)], reduce_op=ReduceOp.MIN),
                       [device_entry("i", AR, rank, i, dtype=DType.INT32, op=ReduceOp.MIN)])
    rows = [r + 1 for r in range(size)]
    (gathered,) = plane.run(respond(AG, ["g"], f32, [(rows[rank], 2)], sizes=(tuple(rows),)),
                            [device_entry("g", AG, rank, np.full((rows[rank], 2), float(rank), np.float32), dtype=f32)])
    (bcast,) = plane.run(respond(BC, ["c"], f32, [(3,)], root_rank=size - 1),
                         [device_entry("c", BC, rank, np.full(3, float(rank), np.float32), dtype=f32)])
    matrix = tuple(tuple(1 for _ in range(size)) for _ in range(size))  # one row to every rank
    send = np.arange(size * 2, dtype=np.float32).reshape(size, 2) + 10 * rank
    ((exchanged, received),) = plane.run(respond(A2A, ["x"], f32, [(size, 2)], sizes=(matrix,)),
                                         [device_entry("x", A2A, rank, send, dtype=f32)])
    scatter = np.arange((size + 1) * 2, dtype=np.float32).reshape(size + 1, 2) * (rank + 1)
    (mine,) = plane.run(respond(RS, ["r"], f32, [(size + 1, 2)]),
                        [device_entry("r", RS, rank, scatter, dtype=f32)])
    return {"a": array_of(fused[0]), "b": array_of(fused[1]), "low": array_of(low), "gathered": array_of(gathered),
            "bcast": array_of(bcast), "exchanged": array_of(exchanged), "received": received.tolist(),
            "mine": array_of(mine)}


def check_every_collective(results: list[dict[str, Any]]) -> None:
    size = len(results)
    a = np.mean([np.arange(6, dtype=np.float64).reshape(2, 3) + r for r in range(size)], axis=0)
    b = np.mean([np.full(4, 2.0 * (r + 1)) for r in range(size)], axis=0)
    total = sum(np.arange((size + 1) * 2, dtype=np.float64).reshape(size + 1, 2) * (r + 1) for r in range(size))
    rows = [2] + [1] * (size - 1)  # size + 1 rows over size ranks: the first rank takes the extra one
    starts = np.cumsum([0] + rows)
    for rank, got in enumerate(results):
        np.testing.assert_allclose(got["a"], a)  # prescale 2 then postscale 0.5: the average itself
        np.testing.assert_allclose(got["b"], b)
        np.testing.assert_array_equal(got["low"], [5 - (size - 1), 0, 7])
        np.testing.assert_array_equal(got["gathered"], np.concatenate(
            [np.full((r + 1, 2), float(r)) for r in range(size)]))
        np.testing.assert_array_equal(got["bcast"], np.full(3, float(size - 1)))
        np.testing.assert_array_equal(got["exchanged"], np.stack(
            [np.arange(size * 2, dtype=np.float32).reshape(size, 2)[rank] + 10 * s for s in range(size)]))
        assert got["received"] == [1] * size
        np.testing.assert_allclose(got["mine"], total[starts[rank] : starts[rank + 1]])
