"""Partial synchronization: which slice of the parameters is averaged at each step.

Every rank applies its own local update each step; then slice ``step % parts`` of the parameters,
taken as one flat vector in a fixed order, is averaged across the ranks. After `parts` steps every
element has been averaged once. The plan is a pure function; the optimizers do the averaging.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgumentError
from ._base import Compressor, Exchange

__all__ = ["PartialSync", "slice_plan"]


def slice_plan(sizes: Sequence[int], parts: int, step: int) -> list[tuple[int, int, int]]:
    """Return ``(tensor index, start, stop)`` element ranges forming slice ``step % parts``.

    The flat vector of ``sum(sizes)`` elements is cut into `parts` contiguous slices whose lengths
    differ by at most one.

    Example:
        >>> slice_plan([3, 5], parts=2, step=1)
        [(1, 1, 5)]
    """
    total = sum(sizes)
    part = step % parts
    lo, hi = total * part // parts, total * (part + 1) // parts
    out, offset = [], 0
    for index, size in enumerate(sizes):
        start, stop = max(lo, offset), min(hi, offset + size)
        if start < stop:
            out.append((index, start - offset, stop - offset))
        offset += size
    return out


class PartialSync(Compressor):
    """Average one rotating `fraction` of the parameters per step instead of every gradient.

    Example:
        >>> PartialSync(0.25).parts
        4
    """

    exchange = Exchange.PARTIAL
    stateful = True

    def __init__(self, fraction: float) -> None:
        if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
            raise InvalidArgumentError(
                f"Partial synchronization fraction must be in (0, 1]. Got fraction={fraction!r}."
            )
        self.fraction = float(fraction)
        self.parts = math.ceil(1.0 / self.fraction - 1e-9)
        self.step = 0
        self._stats = {"steps": 0, "dense_bytes": 0, "payload_bytes": 0}

    def next_plan(self, sizes: Sequence[int]) -> list[tuple[int, int, int]]:
        """The slice to average now; advances the rotation."""
        plan = slice_plan(sizes, self.parts, self.step)
        self.step += 1
        self._stats["steps"] += 1
        return plan

    def count(self, dense_bytes: int, payload_bytes: int) -> None:
        """Record one step's bytes (dense gradient vs slice actually sent)."""
        self._stats["dense_bytes"] += dense_bytes
        self._stats["payload_bytes"] += payload_bytes

    def compress(self, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        raise InvalidArgumentError(
            "PartialSync does not compress gradients; pass it as compression= to a DistributedOptimizer."
        )

    def decompress(self, payload: Any, context: Any) -> Any:  # type: ignore[override]
        raise InvalidArgumentError(
            "PartialSync does not compress gradients; pass it as compression= to a DistributedOptimizer."
        )

    def statistics(self) -> dict[str, int]:
        """Counters: steps, dense gradient bytes, parameter bytes averaged."""
        return dict(self._stats)

    def __repr__(self) -> str:
        return f"PartialSync(fraction={self.fraction}, parts={self.parts}, step={self.step})"
