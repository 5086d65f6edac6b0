"""Map torch tensors to the engine's NumPy buffers and back, zero copy on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...dtypes import DType
from ...errors import InvalidArgumentError, UnisonNotImplementedError, UnsupportedDtypeError

__all__ = ["check_same_device", "dtype_of_tensor", "from_result", "to_buffer"]

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


def cuda_buffer(tensor: torch.Tensor) -> Any:
    """Hand a CUDA tensor to the GPU data plane through DLPack (the one place that would do it).

    The GPU data plane (NCCL through CuPy, ``cupy.from_dlpack(tensor)``, zero copy) is not part of
    this build, so this raises a clear error instead of silently staging through host memory.
    """
    raise UnisonNotImplementedError(
        f"Got a tensor on device {tensor.device}: CUDA tensors need unison's GPU data plane "
        "(NCCL through CuPy, handed over with DLPack), which this build does not have. Move the "
        "tensor to the CPU (tensor.cpu()) or run on CPU tensors."
    )


def to_buffer(tensor: torch.Tensor, *, in_place: bool) -> tuple[np.ndarray, DType]:
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
            return cuda_buffer(tensor)
        raise UnisonNotImplementedError(
            f"Tensors on device {tensor.device} are not supported; move them to the CPU first."
        )
    dtype = dtype_of_tensor(tensor)
    if tensor.is_sparse:
        raise InvalidArgumentError(
            "Sparse tensors cannot be reduced directly; use sparse_allreduce_async or to_dense()."
        )
    if not tensor.is_contiguous():
        if in_place:
            raise InvalidArgumentError("Tensor is required to be contiguous.")
        tensor = tensor.contiguous()
    tensor = tensor.detach()
    if dtype is DType.BFLOAT16:
        return tensor.view(torch.int16).numpy().view(np.uint16), dtype
    return tensor.numpy(), dtype


def from_result(array: np.ndarray, dtype: DType) -> torch.Tensor:
    """Wrap an engine result array as a tensor without copying (bfloat16 bits become bfloat16)."""
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
