"""Framework-free rules shared by the tape and the Keras optimizer: which reduce ops they accept, how a gradient group is named."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArgumentError
from ...ops import ReduceOp

__all__ = ["check_op", "gradient_group_name"]


def check_op(op: Any, gradient_predivide_factor: float) -> ReduceOp:
    """Validate a DistributedOptimizer/tape `op` as Horovod does (Average or Sum only).

    Example:
        >>> check_op(1, 1.0)
        <ReduceOp.SUM: 1>
    """
    try:
        resolved = ReduceOp(int(op))
    except (TypeError, ValueError):
        resolved = None
    if resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise InvalidArgumentError(
            f"op currently only supports Average and Sum. Got op={op!r}; use hvd.Average or hvd.Sum."
        )
    if gradient_predivide_factor != 1.0 and resolved is not ReduceOp.AVERAGE:
        raise InvalidArgumentError(
            "gradient_predivide_factor not supported with op != Average. "
            f"Got gradient_predivide_factor={gradient_predivide_factor} with op={resolved.name}."
        )
    return resolved


def gradient_group_name(names: Sequence[str]) -> str:
    """A name for a step's gradient group, the same on every rank that has the same variables.

    Example:
        >>> gradient_group_name(["dense/kernel", "dense/bias"])[:24]
        'DistributedGradients.2.'
    """
    digest = zlib.crc32("|".join(names).encode())
    return f"DistributedGradients.{len(names)}.{digest:08x}"
