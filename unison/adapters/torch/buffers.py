"""Map torch tensors to the engine's buffers and back without copies: NumPy views on the CPU, CuPy via DLPack on GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...dtypes import DType
from ...errors import InvalidArgumentError, UnisonNotImplementedError, UnsupportedDtypeError

if TYPE_CHECKING:
    from ...gpu.device import DeviceBuffer

__all__ = [
    "check_same_device", "cuda_buffer", "dtype_of_tensor", "from_device_result", "from_result", "to_buffer",
    "wait_for_result",
]

_DTYPES: dict[torch.dtype, DType] = {
    torch.uint8: DType.UINT8,
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.int64: DType.INT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.bool: DType.BOOL,
}


def dtype_of_tensor(tensor: torch.Tensor) -> DType:
    """Return the engine dtype of `tensor`, or Horovod's `Tensor type ... is not supported.`"""
    found = _DTYPES.get(tensor.dtype)
    if found is None:
        supported = ", ".join(str(d) for d in _DTYPES)
        raise UnsupportedDtypeError(
            f"Tensor type {tensor.type()} is not supported. Supported dtypes: {supported}."
        )
    return found


def _dense_contiguous(tensor: torch.Tensor, in_place: bool) -> tuple[torch.Tensor, DType]:
    """`tensor` (a contiguous copy when needed) and its dtype; refuses sparse tensors, and
    non-contiguous ones in place (Horovod's message)."""
    dtype = dtype_of_tensor(tensor)
    if tensor.is_sparse:
        raise InvalidArgumentError(
            "Sparse tensors cannot be reduced directly; use sparse_allreduce_async or to_dense()."
        )
    if not tensor.is_contiguous():
        if in_place:
            raise InvalidArgumentError("Tensor is required to be contiguous.")
        tensor = tensor.contiguous()
    return tensor, dtype


# CuPy's array dtype for each torch dtype the GPU data plane carries (bfloat16 travels as uint16 bits).
_STORAGE: dict[torch.dtype, type[np.generic]] = {
    torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
    torch.int64: np.int64, torch.float16: np.float16, torch.bfloat16: np.uint16, torch.float32: np.float32,
    torch.float64: np.float64, torch.bool: np.bool_,
}


def cuda_buffer(tensor: torch.Tensor, *, in_place: bool = False) -> tuple[DeviceBuffer, DType]:
    """Hand a CUDA tensor to the GPU data plane as a CuPy array sharing its memory (no copy).

    The returned `DeviceBuffer` carries an event recorded on torch's current stream, which unison's
    stream waits on before NCCL reads the tensor (`unison.gpu.ordering`). The first CUDA tensor binds
    the process to its GPU; a tensor on another GPU is refused here, before any rank waits for it.

    The array wraps the tensor's pointer (``UnownedMemory``, which keeps the tensor alive) rather than
    going through DLPack: DLPack's exchange makes CuPy's current stream wait on torch's with an event
    of its own, which the ready event already orders, and costs tens of microseconds per tensor.

    Raises:
        MissingDependencyError: CuPy is not installed (the message names the pip extra).
        InvalidArgumentError: the tensor is on another GPU than earlier ones, or non-contiguous in place.
    """
    from ...gpu.handoff import device_for, import_cupy
    from ...gpu.ordering import mark_ready

    tensor, dtype = _dense_contiguous(tensor, in_place)
    cupy = import_cupy("CUDA tensors")
    ordinal = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    device = device_for(ordinal)
    tensor = tensor.detach()
    if tensor.numel() == 0:  # no pointer to wrap
        array = cupy.from_dlpack(tensor.view(torch.int16) if dtype is DType.BFLOAT16 else tensor)
        array = array.view(cupy.uint16) if dtype is DType.BFLOAT16 else array
    else:
        memory = cupy.cuda.UnownedMemory(tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor,
                                         ordinal)
        array = cupy.ndarray(tuple(tensor.shape), _STORAGE[tensor.dtype], cupy.cuda.MemoryPointer(memory, 0))
    return mark_ready(device, array, "torch"), dtype


# `result` is a DeviceBuffer (Any: callers may hold it as publish()'s DeviceBuffer | None)
def from_device_result(result: Any, dtype: DType) -> torch.Tensor:
    """Wrap a GPU data-plane result as a CUDA tensor without copying, after torch's current stream
    waits for unison's (`unison.gpu.ordering.consume`)."""
    from ...gpu.handoff import device_for
    from ...gpu.ordering import consume

    array = consume(device_for(result.ordinal), result, "torch")
    if dtype is DType.BFLOAT16:
        return torch.from_dlpack(array.view("int16")).view(torch.bfloat16)
    return torch.from_dlpack(array)


def wait_for_result(result: DeviceBuffer) -> None:
    """Make torch's current stream wait for a GPU result written into a tensor the caller already holds
    (in place, or an output allocated before submission): no new tensor is made."""
    from ...gpu.handoff import device_for
    from ...gpu.ordering import consume

    consume(device_for(result.ordinal), result, "torch")


def to_buffer(tensor: torch.Tensor, *, in_place: bool) -> tuple[np.ndarray | DeviceBuffer, DType]:
    """Return a NumPy view sharing `tensor`'s memory (bfloat16 as uint16 bits) and its dtype.

    In-place operations refuse non-contiguous tensors (Horovod's message); out-of-place ones take a
    contiguous copy, which the returned array keeps alive.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"Expected a torch.Tensor. Got {type(tensor).__name__}; use unison's NumPy API for arrays."
        )
    if tensor.device.type != "cpu":
        if tensor.device.type == "cuda":
            return cuda_buffer(tensor, in_place=in_place)
        raise UnisonNotImplementedError(
            f"Tensors on device {tensor.device} are not supported; move them to the CPU first."
        )
    tensor, dtype = _dense_contiguous(tensor, in_place)
    tensor = tensor.detach()
    if dtype is DType.BFLOAT16:
        return tensor.view(torch.int16).numpy().view(np.uint16), dtype
    return tensor.numpy(), dtype


def from_result(array: np.ndarray, dtype: DType) -> torch.Tensor:
    """Wrap an engine result array as a tensor without copying (bfloat16 bits become bfloat16)."""
    if not isinstance(array, np.ndarray) and hasattr(array, "ready"):
        return from_device_result(array, dtype)
    if dtype is DType.BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def check_same_device(tensors: list[torch.Tensor]) -> None:
    """Grouped ops need every tensor on one device (Horovod's message)."""
    from ...errors import HorovodInternalError

    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise HorovodInternalError(
            f"Tensors in list must be on same device. Got devices {sorted(str(d) for d in devices)}."
        )
