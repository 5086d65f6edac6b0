"""Route eager TensorFlow GPU tensors to the GPU data plane through DLPack, or say why they stay on the host.

An eager collective whose inputs all sit on one GPU, with dtypes the device path carries, reaches the
engine as CuPy arrays with ``device="cuda"``: ``tf.experimental.dlpack.to_dlpack`` ->
``cupy.from_dlpack`` (no copy), the NumPy-style collectives (`unison._job.collectives`, which send CuPy
arrays to `unison.gpu`), and back through ``tf.experimental.dlpack.from_dlpack`` (no copy). Everything
else takes the host path the bridge always had (``Tensor.numpy()``, TensorFlow copying back), and
`choose_route` says why:

- inside ``tf.function`` or a ``tf.compat.v1`` graph the bridge op is a ``numpy_function``, which
  TensorFlow places on the CPU and feeds with host copies;
- bfloat16 (CuPy has no such dtype), int32 (TensorFlow keeps int32 tensors of a GPU device in host
  memory) and bool travel through the host;
- a group mixing GPU and CPU tensors, a collective without a device path (alltoall, the compressors'
  own exchanges), and a TensorFlow built without CUDA (ROCm) use the host too.

A GPU tensor bound for the device path without CuPy installed fails with the
`unison.gpu.handoff.missing_cupy` error, which names the pip extra.

Stream order: TensorFlow does not expose its compute stream, so the handoff waits on the host at
both ends instead of through events. Before exporting, `sync_devices` waits for the kernels
TensorFlow queued (the producers of the inputs); after the collective, the host waits for CuPy's
current stream, which already waits for unison's (`unison.gpu.ordering.consume`), so TensorFlow's
kernels only ever read finished results. The same wait at the next submission keeps memory a result
gave back to CuPy's pool from being reused while a TensorFlow kernel still reads it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

if TYPE_CHECKING:
    from ...gpu.device import Array

__all__ = ["DEVICE_DTYPES", "Route", "choose_route", "gpu_ordinal", "route_for", "run_on_device"]

logger = logging.getLogger(__name__)

# The dtypes an eager GPU tensor carries to the GPU data plane; the others go through the host.
DEVICE_DTYPES = frozenset({"float16", "float32", "float64", "int8", "uint8", "int16", "int64"})

_HOST_DTYPE_WHY = {
    "bfloat16": "CuPy has no bfloat16 dtype",
    "int32": "TensorFlow keeps int32 tensors of a GPU device in host memory",
    "bool": "DLPack's bool is not read alike by every TensorFlow and CuPy version",
}

_GPU = re.compile(r"(?:^|/)device:GPU:(\d+)$|^GPU:(\d+)$", re.IGNORECASE)
_logged: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Route:
    """Where one collective's inputs go.

    Attributes:
        device: ``"cuda"`` (the GPU data plane) or ``"cpu"`` (NumPy copies on the host).
        reason: why GPU inputs take the host path; empty when nothing is on a GPU or they go to it.
    """

    device: str
    reason: str = ""


def gpu_ordinal(device: str) -> int | None:
    """The GPU number of a TensorFlow device string, or None when it names no GPU.

    Example:
        >>> gpu_ordinal("/job:localhost/replica:0/task:0/device:GPU:1"), gpu_ordinal("CPU:0")
        (1, None)
    """
    match = _GPU.search(device or "")
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def choose_route(devices: Sequence[str], dtypes: Sequence[str], *, eager: bool, device_path: bool,
                 built_with_cuda: bool, op_name: str = "the collective") -> Route:
    """Decide whether tensors on `devices` with `dtypes` go to the GPU data plane (pure).

    Args:
        devices: each input's TensorFlow device string.
        dtypes: each input's dtype name (``tf.DType.name``).
        eager: whether the op runs now (False while a graph is traced).
        device_path: whether this collective has a device path in unison.
        built_with_cuda: ``tf.test.is_built_with_cuda()``.
        op_name: the collective, for the reason.

    Example:
        >>> choose_route(["GPU:0"], ["float32"], eager=True, device_path=True, built_with_cuda=True)
        Route(device='cuda', reason='')
    """
    on_gpu = [gpu_ordinal(d) is not None for d in devices]
    if not any(on_gpu):
        return Route("cpu")
    if not device_path:
        return Route("cpu", f"{op_name} has no GPU data-plane path; its GPU tensors are copied through "
                            "the host")
    if not eager:
        return Route("cpu", f"{op_name} runs inside tf.function or a graph, where unison's op is a "
                            "numpy_function that TensorFlow feeds with host copies; call it eagerly for "
                            "the GPU data plane")
    if not built_with_cuda:
        return Route("cpu", "this TensorFlow is not built with CUDA (tf.test.is_built_with_cuda() is "
                            "False), so its GPU tensors cannot be handed to CuPy; they are copied "
                            "through the host")
    if not all(on_gpu):
        placed = sorted(set(devices))
        return Route("cpu", f"{op_name} got tensors on the GPU and on the CPU ({', '.join(placed)}); they "
                            "are all copied through the host. Put them on one device for the GPU data "
                            "plane")
    for name in dtypes:
        if name not in DEVICE_DTYPES:
            why = _HOST_DTYPE_WHY.get(name, "the GPU data plane does not carry it")
            return Route("cpu", f"{op_name} got a GPU tensor of dtype {name}, copied through the host ({why}); "
                                f"GPU tensors of {', '.join(sorted(DEVICE_DTYPES))} use the GPU data plane")
    return Route("cuda")


def _device_of(tensor: object) -> str:
    return str(getattr(tensor, "device", "") or "")


def route_for(inputs: Sequence[tf.Tensor], *, device_path: bool, op_name: str) -> Route:
    """`choose_route` for eager tensors; a host-path reason is logged once per distinct reason."""
    devices = [_device_of(t) for t in inputs]
    if not any(gpu_ordinal(d) is not None for d in devices):
        return Route("cpu")  # the common CPU case decides without asking TensorFlow anything else
    route = choose_route(devices, [t.dtype.name for t in inputs], eager=tf.executing_eagerly(),
                         device_path=device_path, built_with_cuda=tf.test.is_built_with_cuda(),
                         op_name=op_name)
    if route.reason and route.reason not in _logged:
        _logged.add(route.reason)
        logger.info("%s", route.reason)
    return route


def _sync_devices() -> None:
    """Wait on the host for every kernel TensorFlow queued (its stream is not exposed)."""
    tf.test.experimental.sync_devices()


def _wait_for_results(xp: Any, outputs: Sequence[Array] = ()) -> None:
    """Wait on the host for CuPy's current stream of each result's GPU, which waits for unison's
    stream (ordering rule 4; CuPy's current stream is per device, so each device is entered)."""
    ordinals: list[int | None] = [*sorted({int(o.device.id) for o in outputs})] or [None]
    for ordinal in ordinals:
        if ordinal is None:
            xp.cuda.get_current_stream().synchronize()
        else:
            with xp.cuda.Device(ordinal):
                xp.cuda.get_current_stream().synchronize()


# `xp` stays Any: it is the CuPy module (imported lazily, untyped) or a test's stand-in for it.
# `fn` returns CuPy arrays and host values mixed, told apart only at run time.
def run_on_device(fn: Callable[..., Sequence[Any]], inputs: Sequence[tf.Tensor], output_dtypes: Sequence[tf.DType],
                  *, xp: Any = None, to_dlpack: Callable[[tf.Tensor], object] | None = None,
                  from_dlpack: Callable[[object], tf.Tensor] | None = None, sync: Callable[[], None] = _sync_devices,
                  wait: Callable[[Any, Sequence[Array]], None] = _wait_for_results) -> list[tf.Tensor]:
    """Run `fn` on CuPy views of GPU `inputs` and return its results as TensorFlow GPU tensors.

    Arrays `fn` returns on the GPU come back through DLPack without a copy; host values (a count, a
    NumPy array) are converted with `output_dtypes`. `xp`, `to_dlpack`, `from_dlpack`, `sync` and
    `wait` default to CuPy, TensorFlow's DLPack functions and the host waits; tests pass stand-ins.

    Raises:
        MissingDependencyError: CuPy is not installed (the message names the pip extra).
    """
    if xp is None:
        from ...gpu.handoff import import_cupy

        xp = import_cupy("TensorFlow GPU tensors")
    to_dlpack = tf.experimental.dlpack.to_dlpack if to_dlpack is None else to_dlpack
    from_dlpack = tf.experimental.dlpack.from_dlpack if from_dlpack is None else from_dlpack
    sync()
    arrays = [xp.from_dlpack(to_dlpack(t)) for t in inputs]
    outputs = list(fn(*arrays))
    on_device = [isinstance(o, xp.ndarray) for o in outputs]
    if any(on_device):
        wait(xp, [o for o, device in zip(outputs, on_device) if device])
    tensors = []
    for output, dtype, device in zip(outputs, output_dtypes, on_device):
        if device:
            tensor = from_dlpack(output.__dlpack__())
            if tensor.dtype != dtype:
                tensor = tf.cast(tensor, dtype)
            tensors.append(tensor)
        else:
            tensors.append(tf.convert_to_tensor(output, dtype=dtype))
    return tensors
