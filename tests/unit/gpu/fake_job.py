"""A job of GPU data planes on fake devices: ranks as threads, the host plane in memory, NCCL faked."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unison.backends.loopback import ThreadGroup
from unison.dtypes import DType
from unison.engine.executor import Entry, Handle
from unison.gpu.device import DeviceBuffer
from unison.gpu.fake import FakeDevice, FakeLibrary
from unison.gpu.plane import GpuPlane
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.messages import Request


def make_planes(size: int, *, operations: str = "nccl", bus_ids: Sequence[str] | None = None,
                library: Any = None, init_timeout_seconds: float = 10.0,
                process_sets: dict[int, tuple[int, ...]] | None = None) -> list[GpuPlane]:
    """One plane per rank, each on its own fake device, sharing one thread group and fake NCCL."""
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
                               init_timeout_seconds=init_timeout_seconds, host="node"))
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
