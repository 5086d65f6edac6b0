"""Planes on the real GPU: one rank over loopback, or ranks as threads sharing one GPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from unison.backends.loopback import LoopbackBackend, ThreadGroup
from unison.dtypes import DType, bfloat16_to_float32, float32_to_bfloat16
from unison.engine.handles import Entry, Handle
from unison.gpu.plane import GpuPlane
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.messages import Request, Response


def cupy() -> Any:
    import cupy as cp

    return cp


def single_plane(operations: str = "nccl") -> GpuPlane:
    from unison.gpu import handoff
    from unison.gpu.cupy_device import CupyLibrary

    handoff.reset()
    device = handoff.device_for(0)
    return GpuPlane(LoopbackBackend(), 0, {0: (0,)}, device, CupyLibrary() if operations == "nccl" else None,
                    operations=operations)


def thread_planes(size: int, operations: str) -> list[GpuPlane]:
    """`size` ranks as threads on GPU 0 (each its own CupyDevice, so its own stream)."""
    from unison.gpu.cupy_device import CupyDevice, CupyLibrary

    group = ThreadGroup(size)
    return [GpuPlane(group.backend(r), r, {0: tuple(range(size))}, CupyDevice(0),
                     CupyLibrary() if operations == "nccl" else None, operations=operations, init_timeout_seconds=30)
            for r in range(size)]


def on_device(host: np.ndarray, device: Any) -> Any:
    from unison.gpu.ordering import mark_ready

    return mark_ready(device, cupy().asarray(host))


def entry(name: str, kind: CollectiveKind, rank: int, host: np.ndarray, device: Any, dtype: DType,
          op: ReduceOp = ReduceOp.SUM) -> Entry:
    source = on_device(host, device)
    output = None
    if kind in (CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST):
        output = on_device(np.zeros_like(host), device)
    request = Request(name, kind, rank, dtype, tuple(host.shape), op, device="cuda")
    return Entry(request, source, output, Handle(name))


def respond(kind: CollectiveKind, names: list[str], dtype: DType, shapes: list[tuple[int, ...]], **kw: Any) -> Response:
    return Response(kind.value, tuple(names), dtype, tuple(shapes), device="cuda", **kw)


def host_values(dtype: DType, numbers: Any) -> np.ndarray:
    array = np.asarray(numbers, dtype=np.float32)
    if dtype is DType.BFLOAT16:
        return float32_to_bfloat16(array.reshape(-1)).reshape(array.shape)
    return array.astype(dtype.storage)


def as_float(array: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.BFLOAT16:
        return bfloat16_to_float32(np.ascontiguousarray(array).reshape(-1)).reshape(array.shape)
    return np.asarray(array, dtype=np.float64)


def fetch(result: Any) -> np.ndarray:
    """Copy a result to the host after waiting, on the current stream, for unison's event."""
    from unison.gpu import handoff
    from unison.gpu.ordering import consume

    array = consume(handoff.device_for(result.ordinal), result)
    return np.asarray(array.get(stream=cupy().cuda.get_current_stream()))
