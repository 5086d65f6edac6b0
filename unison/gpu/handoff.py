"""How GPU arrays reach the engine: CuPy imported on demand, one GPU per process, zero-copy wrapping.

Framework adapters call `device_for(ordinal)` for the `Device` of the tensor's GPU (the first call
binds the process to that GPU; a tensor on another one is refused at submission, before any rank
waits for it) and `mark_ready` (`unison.gpu.ordering`) to wrap the array for submission. CuPy arrays
and any object with ``__cuda_array_interface__`` or ``__dlpack__`` become CuPy arrays without a copy
through `as_cupy`. When CuPy is missing, the error names the pip extra that installs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..dtypes import DType, dtype_of
from ..errors import InvalidArgumentError
from .device import Array, Device, DeviceBuffer
from .lazy_cupy import EXTRAS, import_cupy, missing_cupy
from .ordering import consume, forget_waits, mark_ready

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "EXTRAS", "as_cupy", "bound_ordinal", "device_for", "device_results", "import_cupy", "missing_cupy",
    "prepare_arrays", "reset",
]

_lock = threading.Lock()
_bound: int | None = None
_devices: dict[int, Device] = {}
_dtypes: dict[np.dtype, DType] = {}  # array dtype -> unison DType, for the arrays of the NumPy-style API


def bound_ordinal() -> int | None:
    """The GPU this process's collectives use, or None before the first GPU collective."""
    return _bound


def device_for(ordinal: int, make: Callable[[int], Device] | None = None) -> Any:
    """The `Device` for GPU `ordinal`, binding the process to it on first use.

    Typed Any: a `CupyDevice` (or what `make` makes), whose own attributes callers use beyond `Device`.

    Args:
        ordinal: the tensor's CUDA device number.
        make: ordinal -> device (default: `CupyDevice`); tests pass `FakeDevice`.

    Raises:
        InvalidArgumentError: the process already uses another GPU (NCCL gives each rank one device).
        MissingDependencyError: CuPy is not installed.
    """
    global _bound
    if make is None and ordinal == _bound:  # the common case, every tensor after the first: no lock
        device = _devices.get(ordinal)
        if device is not None:
            return device
    with _lock:
        if _bound is not None and ordinal != _bound:
            raise InvalidArgumentError(
                f"unison's GPU collectives use one GPU per process: this one uses cuda:{_bound} since its "
                f"first GPU collective, and got a tensor on cuda:{ordinal}. Move the tensor to cuda:{_bound} "
                "(one GPU per rank: torch.cuda.set_device(hvd.local_rank()) before creating tensors)."
            )
        device = _devices.get(ordinal)
        if device is None:
            if make is None:
                from .cupy_device import CupyDevice

                make = CupyDevice
            device = _devices[ordinal] = make(ordinal)
        _bound = ordinal
        return device


def reset() -> None:
    """Forget the bound GPU and its device (at shutdown, and between tests)."""
    global _bound
    with _lock:
        _bound = None
        _devices.clear()
        forget_waits()


def as_cupy(obj: object) -> Array:
    """`obj` as a CuPy array sharing its memory (a CuPy array, ``__cuda_array_interface__``, DLPack).

    Raises:
        InvalidArgumentError: `obj` is not a GPU array.
        MissingDependencyError: CuPy is not installed.
    """
    cupy = import_cupy()
    if isinstance(obj, cupy.ndarray):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return cupy.asarray(obj)  # wraps the pointer, no copy
    if hasattr(obj, "__dlpack__"):
        return cupy.from_dlpack(obj)
    raise InvalidArgumentError(f"Expected a GPU array (CuPy, __cuda_array_interface__ or DLPack). Got "
                               f"{type(obj).__name__}.")


def prepare_arrays(arrays: Iterable[object], *, in_place: bool, with_outputs: bool,
                   make: Callable[[int], Device] | None = None, convert: Callable[[object], Array] | None = None,
                   xp: ModuleType | None = None) -> tuple[list[DeviceBuffer], list[DType], list[Any] | None]:
    """GPU arrays of the NumPy-style API as (buffers, dtypes, outputs) for `unison._job.submit.submit`.

    Each array is wrapped without a copy (`as_cupy`; a non-contiguous one is copied unless in place)
    with an event on the current stream (`mark_ready`); `outputs` are fresh arrays like the inputs when
    the collective writes into outputs (allreduce, broadcast), else None (typed Any: `DeviceBuffer`s,
    where `submit` takes host buffers, which they stand in for). `make`, `convert` and `xp`
    (device factory, array conversion, array module) default to CuPy's; tests pass NumPy and fakes.

    Raises:
        InvalidArgumentError: an in-place array is not contiguous, or arrays sit on different GPUs.
        UnsupportedDtypeError: a dtype unison cannot carry.
    """
    import numpy as np

    convert = as_cupy if convert is None else convert
    xp = import_cupy() if xp is None else xp
    buffers, dtypes = [], []
    for obj in arrays:
        array = convert(obj)
        if not array.flags.c_contiguous:
            if in_place:
                raise InvalidArgumentError("Tensor is required to be contiguous.")
            array = xp.ascontiguousarray(array)
        ordinal = int(getattr(getattr(array, "device", None), "id", 0) or 0)
        dtype = _dtypes.get(array.dtype)
        if dtype is None:
            dtype = _dtypes[array.dtype] = dtype_of(np.empty(0, array.dtype))
        dtypes.append(dtype)
        buffers.append(mark_ready(device_for(ordinal, make), array))
    outputs = None
    if with_outputs:
        outputs = [DeviceBuffer(xp.empty_like(b.array), None, b.ordinal) for b in buffers]
    return buffers, dtypes, outputs


def device_results(results: Iterable[Any], make: Callable[[int], Device] | None = None) -> list[Any]:
    """The arrays of GPU results, after the current stream waits for unison's (rule 4 of `ordering`)."""
    out = []
    for result in results:
        if result is not None and hasattr(result, "ready"):
            out.append(consume(device_for(result.ordinal, make), result))
        else:
            out.append(result)
    return out
