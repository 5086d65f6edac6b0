"""PowerSGD: rank-r low-rank gradient approximation with error feedback, on NumPy arrays.

Each gradient of two or more dimensions is viewed as an n x m matrix M (first dimension by the
rest), and the residual kept from earlier steps is added. With Q (m x r, warm-started from the
previous step, identical on every rank) each rank computes P = M Q; the ranks sum P; P is
orthonormalized (reduced QR, so every rank gets the same basis); each rank computes Q = M^T P; the
ranks sum Q; the result is P Q^T = P P^T (sum of the ranks' M). Each rank keeps M - P P^T M as its new
residual, so the ranks' residuals add up to exactly what the approximation left out. 4·r·(n + m)
bytes travel instead of 4·n·m. Vectors, and matrices too small for rank r to save bytes, are summed
uncompressed. See Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization" (NeurIPS 2019).

The exchange itself (two grouped allreduces) is `unison.compression._exchange.lowrank_allreduce`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ._base import Compressor, Exchange

__all__ = ["LowRankState", "PowerSGDCompressor"]


@dataclasses.dataclass
class LowRankState:
    """One tensor's step in flight: its corrected matrix, local factors and original form."""

    name: str
    matrix: np.ndarray  # M: gradient + residual, n x m
    shape: tuple[int, ...]
    dtype: np.dtype
    p: np.ndarray | None = None  # orthonormal P after the first sum


class PowerSGDCompressor(Compressor):
    """Rank-`rank` PowerSGD with error feedback and warm-started Q, one instance per optimizer.

    Args:
        rank: columns of the low-rank factors (1 to 4 is typical; higher is more exact, costs more).
        seed: seeds the initial Q of each tensor (with the tensor's name), identical on every rank.

    Example:
        >>> c = PowerSGDCompressor(rank=2)
        >>> c.matrix_shape((64, 3, 3, 3)), c.matrix_shape((10,)), c.matrix_shape((3, 3))
        ((64, 27), None, None)
    """

    exchange = Exchange.LOWRANK
    stateful = True

    def __init__(self, rank: int = 1, seed: int = 0) -> None:
        if not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
            raise InvalidArgumentError(f"PowerSGD rank must be an integer >= 1. Got rank={rank!r}.")
        self.rank = rank
        self.seed = int(seed)
        self._residuals: dict[str, np.ndarray] = {}
        self._qs: dict[str, np.ndarray] = {}
        self._stats = {"compressed": 0, "uncompressed": 0, "dense_bytes": 0, "payload_bytes": 0}

    def __repr__(self) -> str:
        return f"PowerSGDCompressor(rank={self.rank}, tensors={len(self._qs)})"

    def matrix_shape(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """The n x m view used for a tensor of `shape`, or None when it is sent uncompressed."""
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        if self.rank * (n + m) >= n * m:
            return None
        return n, m

    def _initial_q(self, name: str, m: int, dtype: np.dtype) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        return rng.standard_normal((m, self.rank)).astype(dtype)

    def begin(self, array: np.ndarray, name: str) -> tuple[np.ndarray, LowRankState]:
        """Add the residual and return (this rank's P = M Q, the state). Only for compressible shapes."""
        shape = tuple(array.shape)
        view = self.matrix_shape(shape)
        if view is None:
            raise InvalidArgumentError(f"PowerSGD cannot compress {name!r} of shape {shape}; send it dense.")
        dtype = np.dtype(np.float64 if array.dtype == np.float64 else np.float32)
        matrix = np.asarray(array, dtype=dtype).reshape(view)
        residual = self._residuals.get(name)
        matrix = matrix + residual if residual is not None and residual.shape == view else matrix.copy()
        q = self._qs.get(name)
        if q is None or q.shape != (view[1], self.rank) or q.dtype != dtype:
            q = self._initial_q(name, view[1], dtype)
        self._stats["compressed"] += 1
        self._stats["dense_bytes"] += array.nbytes
        self._stats["payload_bytes"] += self.rank * (view[0] + view[1]) * dtype.itemsize
        return matrix @ q, LowRankState(name, matrix, shape, np.dtype(array.dtype))

    def middle(self, state: LowRankState, p_sum: np.ndarray) -> np.ndarray:
        """Orthonormalize the summed P; return this rank's Q = M^T P."""
        p, _ = np.linalg.qr(np.asarray(p_sum, dtype=state.matrix.dtype).reshape(state.matrix.shape[0], -1))
        state.p = p
        q_local = state.matrix.T @ p
        # What this rank's own projection leaves out is kept: the ranks' residuals sum to the error.
        self._residuals[state.name] = state.matrix - p @ q_local.T
        return q_local

    def end(self, state: LowRankState, q_sum: np.ndarray) -> np.ndarray:
        """Return P Q_sum^T in the tensor's shape and dtype; Q_sum warm-starts the next step."""
        assert state.p is not None
        q_sum = np.asarray(q_sum, dtype=state.matrix.dtype).reshape(state.matrix.shape[1], -1)
        self._qs[state.name] = q_sum.copy()
        return (state.p @ q_sum.T).reshape(state.shape).astype(state.dtype, copy=False)

    def count_uncompressed(self, nbytes: int) -> None:
        """Record a tensor sent dense (a vector or a small matrix)."""
        self._stats["uncompressed"] += 1
        self._stats["dense_bytes"] += nbytes
        self._stats["payload_bytes"] += nbytes

    def compress(self, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        raise InvalidArgumentError(
            "PowerSGD needs two exchanges per step; pass it as compression= to a DistributedOptimizer "
            "or DistributedGradientTape instead of calling compress()."
        )

    def decompress(self, payload: Any, context: Any) -> Any:  # type: ignore[override]
        raise InvalidArgumentError(
            "PowerSGD needs two exchanges per step; pass it as compression= to a DistributedOptimizer "
            "or DistributedGradientTape instead of calling decompress()."
        )

    def residual(self, name: str) -> np.ndarray | None:
        """The error-feedback residual kept for `name` (n x m), or None before its first step."""
        return self._residuals.get(name)

    def reset(self) -> None:
        """Forget residuals and warm starts (after loading a checkpoint, say)."""
        self._residuals.clear()
        self._qs.clear()

    def statistics(self) -> dict[str, int]:
        """Counters: tensors compressed and sent dense, their dense bytes, payload bytes sent."""
        return dict(self._stats)
