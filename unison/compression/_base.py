"""The compressor interface every scheme implements, and the collective each scheme needs."""

from __future__ import annotations

import enum
from typing import Any, ClassVar

import numpy as np

__all__ = ["Compressor", "Exchange", "payload_bytes"]


class Exchange(str, enum.Enum):
    """How ranks combine a compressor's payloads."""

    ALLREDUCE = "allreduce"  # payload is a dense tensor; ranks sum it
    ALLGATHER = "allgather"  # payload is (indices, values); ranks concatenate them
    PARTIAL = "partial"  # no gradient exchange; a rotating slice of the parameters is averaged
    LOWRANK = "lowrank"  # PowerSGD: two allreduces of low-rank factors with local work in between


class Compressor:
    """Interface: ``compress(tensor) -> (payload, context)``; ``decompress(payload, context)`` undoes it.

    Horovod's compressors are classes with static methods and ``exchange`` Allreduce; a scheme that
    keeps state (error feedback) is an instance and also receives the tensor's ``name``.
    """

    exchange: ClassVar[Exchange] = Exchange.ALLREDUCE
    stateful: ClassVar[bool] = False

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Return the payload to send and whatever `decompress` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(payload: Any, context: Any) -> Any:
        """Return the combined payload in the tensor's original form."""
        raise NotImplementedError


def payload_bytes(payload: Any) -> int:
    """Bytes a payload (an array, a tensor, or a tuple of them) occupies on the wire."""
    if isinstance(payload, (tuple, list)):
        return sum(payload_bytes(p) for p in payload)
    nbytes = getattr(payload, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    if hasattr(payload, "element_size"):  # torch
        return int(payload.element_size() * payload.numel())
    if hasattr(payload, "dtype") and hasattr(payload, "shape"):  # tf
        return int(np.prod(payload.shape.as_list() or [1]) * payload.dtype.size)
    raise TypeError(f"payload_bytes cannot size a {type(payload).__name__}.")
