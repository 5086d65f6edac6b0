"""Top-K and threshold sparsification with error feedback, on NumPy arrays.

Each rank adds the residual it kept from earlier steps to its gradient, sends the selected entries
as (int32 index, value) pairs, and keeps the rest as the new residual, so no part of the gradient is
ever dropped, only delayed. The ranks allgather the pairs; `decompress` scatters and sums them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ._base import Compressor, Exchange

__all__ = ["SparseContext", "Sparsifier", "ThresholdCompressor", "TopKCompressor", "scatter_sum"]


@dataclasses.dataclass(frozen=True)
class SparseContext:
    """What `decompress` needs: the dense shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype


def scatter_sum(indices: np.ndarray, values: np.ndarray, numel: int, dtype: Any) -> np.ndarray:
    """Dense vector of `numel` entries: the sum of `values` at `indices` (repeats add up)."""
    summed = np.bincount(indices.astype(np.int64), weights=values.astype(np.float64), minlength=numel)
    return summed.astype(dtype, copy=False)


class Sparsifier(Compressor):
    """Base of the sparsifying schemes: error feedback per tensor name, byte counters."""

    exchange = Exchange.ALLGATHER
    stateful = True

    def __init__(self) -> None:
        self._residuals: dict[str, np.ndarray] = {}
        self._stats = {"compressed": 0, "dense_bytes": 0, "payload_bytes": 0, "sent_entries": 0}

    def _select(self, flat: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def compress(self, tensor: Any, name: str = "") -> tuple[tuple[np.ndarray, np.ndarray], SparseContext]:  # type: ignore[override]
        """Return ((indices, values), context) for `tensor` plus the residual kept under `name`."""
        array = np.asarray(tensor)
        flat = array.reshape(-1)
        residual = self._residuals.get(name)
        corrected = flat.copy() if residual is None or residual.shape != flat.shape else flat + residual
        indices = self._select(corrected).astype(np.int32)
        values = corrected[indices]
        corrected[indices] = 0
        self._residuals[name] = corrected
        self._stats["compressed"] += 1
        self._stats["dense_bytes"] += flat.nbytes
        self._stats["payload_bytes"] += indices.nbytes + values.nbytes
        self._stats["sent_entries"] += int(indices.size)
        return (indices, values), SparseContext(tuple(array.shape), array.dtype)

    def decompress(self, payload: Any, context: Any) -> np.ndarray:  # type: ignore[override]
        """Sum the gathered (indices, values) pairs into a dense array of the original shape."""
        indices, values = payload
        numel = math.prod(context.shape)
        dense = scatter_sum(np.asarray(indices).reshape(-1), np.asarray(values).reshape(-1), numel,
                            context.dtype)
        return dense.reshape(context.shape)

    def residual(self, name: str) -> np.ndarray | None:
        """The error-feedback residual kept for `name` (flat), or None before its first step."""
        return self._residuals.get(name)

    def reset(self) -> None:
        """Forget every residual (after loading a checkpoint, say)."""
        self._residuals.clear()

    def statistics(self) -> dict[str, int]:
        """Counters: tensors compressed, their dense bytes, payload bytes sent, entries sent."""
        return dict(self._stats)


class TopKCompressor(Sparsifier):
    """Send the ``ceil(ratio * n)`` entries of largest magnitude (at least one) of each tensor.

    Example:
        >>> c = TopKCompressor(0.5)
        >>> (idx, vals), ctx = c.compress(np.array([1.0, -3.0, 0.5, 2.0]), "w")
        >>> sorted(idx.tolist()), c.residual("w").tolist()
        ([1, 3], [1.0, 0.0, 0.5, 0.0])
    """

    def __init__(self, ratio: float) -> None:
        if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
            raise InvalidArgumentError(f"Top-K ratio must be in (0, 1]. Got ratio={ratio!r}.")
        super().__init__()
        self.ratio = float(ratio)

    def count(self, numel: int) -> int:
        """How many entries a tensor of `numel` entries sends."""
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def _select(self, flat: np.ndarray) -> np.ndarray:
        k = self.count(flat.size)
        if k >= flat.size:
            return np.arange(flat.size)
        return np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]

    def __repr__(self) -> str:
        return f"TopKCompressor(ratio={self.ratio}, tensors={len(self._residuals)})"


class ThresholdCompressor(Sparsifier):
    """Send the entries whose magnitude exceeds `threshold` (after adding the residual)."""

    def __init__(self, threshold: float) -> None:
        if not (isinstance(threshold, (int, float)) and threshold >= 0.0):
            raise InvalidArgumentError(f"threshold must be a number >= 0. Got threshold={threshold!r}.")
        super().__init__()
        self.threshold = float(threshold)

    def _select(self, flat: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.abs(flat) > self.threshold)

    def __repr__(self) -> str:
        return f"ThresholdCompressor(threshold={self.threshold}, tensors={len(self._residuals)})"
