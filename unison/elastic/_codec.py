"""Encode a state (nested Python objects holding NumPy arrays or torch tensors) as a few flat buffers.

Arrays and tensors travel out of band (pickle protocol 5): the encoding references their memory
instead of copying it, so writing the parts to a file is the only copy of the tensor bytes. Decoding
builds arrays and tensors that view the one buffer read back. Pickle runs code named by the data:
only for the job's own commits, never for bytes from elsewhere.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["decode", "encode", "total_bytes"]

_HEADER = struct.Struct("<QQ")  # pickle length, number of buffers; then one length per buffer


def _tensor(array: np.ndarray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    import torch

    tensor = torch.from_numpy(array)
    wanted = getattr(torch, dtype)
    if tensor.dtype != wanted:
        tensor = tensor.view(wanted)
    return tensor.reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(
            self, obj: object) -> tuple[Callable[..., torch.Tensor], tuple[np.ndarray, str, tuple[int, ...]]]:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(obj, torch.Tensor):
            return NotImplemented
        tensor = obj.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        flat = tensor.reshape(-1)
        try:
            array = flat.numpy()
        except TypeError:  # bfloat16 and other types NumPy lacks: their bits as integers of that width
            array = flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
                tensor.element_size()]).numpy()
        return _tensor, (array, dtype, tuple(tensor.shape))


def encode(obj: object) -> list[memoryview]:
    """The buffers that `decode` turns back into `obj`: a header, the pickle, then each array's bytes."""
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    raws = [buffer.raw() for buffer in buffers]
    head = _HEADER.pack(stream.getbuffer().nbytes, len(raws)) + struct.pack(
        f"<{len(raws)}Q", *(raw.nbytes for raw in raws))
    return [memoryview(head), stream.getbuffer(), *raws]


def total_bytes(parts: Sequence[memoryview]) -> int:
    """The encoded size of `parts`."""
    return sum(part.nbytes for part in parts)


def decode(data: bytearray | memoryview) -> Any:  # the object encoded, of the caller's own type
    """The object `encode` encoded into `data` (arrays and tensors view `data`, which must be writable)."""
    view = memoryview(data)
    size, count = _HEADER.unpack_from(view, 0)
    at = _HEADER.size
    lengths = struct.unpack_from(f"<{count}Q", view, at)
    at += 8 * count
    payload = view[at:at + size]
    at += size
    buffers = []
    for length in lengths:
        buffers.append(view[at:at + length])
        at += length
    return pickle.loads(payload, buffers=buffers)
