"""The gradient policy shared by every DistributedOptimizer and DistributedGradientTape, framework-free.

A `GradientPolicy` is built once, by `gradient_policy`, from the user's wrapper arguments: it checks
them with Horovod's error texts and freezes the result. The adapters (torch, TensorFlow, Keras) keep
only their tensor conversions and hooks, and ask the functions below which op and scale factors a
gradient's reduction takes, how a reduced or local gradient is scaled, and what its collective is
named (the same on every rank, so negotiation and the response cache recognise the same step).

Example:
    >>> from unison.process_sets import global_process_set
    >>> policy = gradient_policy(Framework.TENSORFLOW, op=1, process_set=global_process_set)
    >>> allreduce_scaling(policy)
    (<ReduceOp.SUM: 1>, 1.0, 1.0)
"""

from __future__ import annotations

import dataclasses
import enum
import zlib
from collections.abc import Sequence
from typing import Any

from ..compression import Exchange
from ..errors import InvalidArgumentError
from ..ops import ReduceOp
from ..process_sets import ProcessSet
from .submit import resolve_op

__all__ = [
    "Framework",
    "GradientPolicy",
    "aggregation_divisor",
    "allreduce_scaling",
    "bucket_name",
    "check_passes",
    "gradient_group_name",
    "gradient_policy",
    "local_divisor",
    "partial_name",
    "self_reduced_scale",
    "sparse_name",
    "sparsified_name",
    "split_local",
]


class Framework(enum.Enum):
    """Whose Horovod rules a wrapper follows: torch accepts every op (Adasum as a delta step),
    TensorFlow's tape Average, Sum and Adasum, Keras only Average and Sum; each runs a different
    subset of the compression exchanges."""

    TORCH = "torch"
    TENSORFLOW = "tensorflow"
    KERAS = "keras"


@dataclasses.dataclass(frozen=True)
class GradientPolicy:
    """How a wrapper reduces gradients, validated once (see `gradient_policy`)."""

    framework: Framework
    op: ReduceOp
    gradient_predivide_factor: float
    compression: Any
    exchange: Exchange
    sparse_as_dense: bool
    process_set: ProcessSet
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    scale_local_gradients: bool


def gradient_policy(framework: Framework, *, op: Any, process_set: ProcessSet, compression: Any = None,
                    gradient_predivide_factor: float = 1.0, sparse_as_dense: bool = False,
                    backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                    scale_local_gradients: bool = True) -> GradientPolicy:
    """Check a wrapper's arguments as Horovod does for `framework` and return the frozen policy.

    Example:
        >>> from unison.process_sets import global_process_set
        >>> gradient_policy(Framework.KERAS, op=0, process_set=global_process_set).op
        <ReduceOp.AVERAGE: 0>
    """
    resolved = resolve_op(op, None) if framework is Framework.TORCH else _average_or_sum(op, framework)
    if gradient_predivide_factor != 1.0 and resolved is not ReduceOp.AVERAGE:
        raise InvalidArgumentError(
            "gradient_predivide_factor not supported with op != Average. "
            f"Got gradient_predivide_factor={gradient_predivide_factor} with op={resolved.name}."
        )
    check_passes(backward_passes_per_step)
    exchange = Exchange(getattr(compression, "exchange", Exchange.ALLREDUCE))
    _check_exchange(framework, exchange, compression, resolved, backward_passes_per_step)
    return GradientPolicy(framework=framework, op=resolved,
                          gradient_predivide_factor=float(gradient_predivide_factor),
                          compression=compression, exchange=exchange, sparse_as_dense=bool(sparse_as_dense),
                          process_set=process_set, backward_passes_per_step=backward_passes_per_step,
                          average_aggregated_gradients=bool(average_aggregated_gradients),
                          scale_local_gradients=bool(scale_local_gradients))


def check_passes(passes: Any) -> None:
    """Reject a `backward_passes_per_step` that is not an integer >= 1.

    Example:
        >>> check_passes(0)
        Traceback (most recent call last):
        ...
        unison.errors.InvalidArgumentError: backward_passes_per_step must be an integer >= 1. Got 0.
    """
    if not isinstance(passes, int) or passes < 1:
        raise InvalidArgumentError(f"backward_passes_per_step must be an integer >= 1. Got {passes!r}.")


def _average_or_sum(op: Any, framework: Framework) -> ReduceOp:
    """Average or Sum; Adasum too for TensorFlow's gradient tape, never for Keras (Horovod's rules)."""
    try:
        resolved = ReduceOp(int(op))
    except (TypeError, ValueError):
        resolved = None
    if resolved is ReduceOp.ADASUM:
        if framework is Framework.TENSORFLOW:
            return resolved
        raise InvalidArgumentError(
            "op == Adasum is not supported yet with Keras. Use op=hvd.Average, or a custom training "
            "loop with hvd.DistributedGradientTape(tape, op=hvd.Adasum)."
        )
    if resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise InvalidArgumentError(
            f"op currently only supports Average and Sum. Got op={op!r}; use hvd.Average or hvd.Sum."
        )
    return resolved


def _check_exchange(framework: Framework, exchange: Exchange, compression: Any, op: ReduceOp,
                    passes: int) -> None:
    if exchange is Exchange.ALLREDUCE:
        return
    if op is ReduceOp.ADASUM:
        raise InvalidArgumentError(
            f"compression={compression!r} cannot be combined with op=Adasum: Adasum combines whole "
            "tensors. Use Compression.none, fp16 or bf16 with it."
        )
    if framework is Framework.TORCH:
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM) or (exchange is Exchange.PARTIAL
                                                         and op is not ReduceOp.AVERAGE):
            raise InvalidArgumentError(
                f"compression={compression!r} supports op=Average (and op=Sum for sparsifiers and "
                f"PowerSGD). Got op={op.name}."
            )
    elif exchange is Exchange.PARTIAL and framework is Framework.KERAS:
        if passes != 1 or op is not ReduceOp.AVERAGE:
            raise InvalidArgumentError(
                "Compression.partial averages parameters after every step: it needs op=Average and "
                f"backward_passes_per_step=1. Got op={op.name}, backward_passes_per_step={passes}."
            )
    elif exchange is Exchange.PARTIAL:
        raise InvalidArgumentError(
            f"compression={compression!r} cannot reduce gradients here; partial synchronization works "
            "with the Keras DistributedOptimizer on the torch backend."
        )


# -- scaling -----------------------------------------------------------------------------------------


def allreduce_scaling(policy: GradientPolicy) -> tuple[ReduceOp, float, float]:
    """(op, prescale, postscale) of a gradient's allreduce.

    Average with a predivide factor ``f`` divides by ``f`` before the sum and multiplies by ``f`` after
    it; the engine folds the ``1/size`` of Average into the postscale.

    Example:
        >>> from unison.process_sets import global_process_set
        >>> policy = gradient_policy(Framework.TORCH, op=0, gradient_predivide_factor=2.0,
        ...                          process_set=global_process_set)
        >>> allreduce_scaling(policy)
        (<ReduceOp.AVERAGE: 0>, 0.5, 2.0)
    """
    if policy.op is ReduceOp.AVERAGE:
        return ReduceOp.AVERAGE, 1.0 / policy.gradient_predivide_factor, policy.gradient_predivide_factor
    return policy.op, 1.0, 1.0


def self_reduced_scale(policy: GradientPolicy, size: int | None) -> float:
    """The factor a compressor that sums by itself (sparsifier, PowerSGD) applies to the sum (size None: 1).

    Example:
        >>> from unison.process_sets import global_process_set
        >>> self_reduced_scale(gradient_policy(Framework.TORCH, op=0, process_set=global_process_set), 4)
        0.25
    """
    return 1.0 / (size or 1) if policy.op is ReduceOp.AVERAGE else 1.0


def local_divisor(policy: GradientPolicy, size: int) -> int | None:
    """What a gradient kept local is divided by (Horovod's scale_local_gradients), or None.

    Example:
        >>> from unison.process_sets import global_process_set
        >>> local_divisor(gradient_policy(Framework.KERAS, op=0, process_set=global_process_set), 2)
        2
    """
    return size if policy.scale_local_gradients and size > 1 else None


def aggregation_divisor(policy: GradientPolicy) -> int | None:
    """What locally aggregated gradients are divided by before the reduction, or None.

    Example:
        >>> from unison.process_sets import global_process_set
        >>> aggregation_divisor(gradient_policy(Framework.KERAS, op=0, backward_passes_per_step=4,
        ...     average_aggregated_gradients=True, process_set=global_process_set))
        4
    """
    if policy.average_aggregated_gradients and policy.backward_passes_per_step > 1:
        return policy.backward_passes_per_step
    return None


def split_local(present: Sequence[bool], local: Sequence[bool]) -> tuple[list[int], list[int]]:
    """(indices reduced across ranks, indices kept local) of a step's gradients; absent ones are neither.

    Example:
        >>> split_local([True, True, False], [False, True, False])
        ([0], [1])
    """
    flags = list(local) or [False] * len(present)
    reduced = [i for i, here in enumerate(present) if here and not flags[i]]
    kept = [i for i, here in enumerate(present) if here and flags[i]]
    return reduced, kept


# -- naming ------------------------------------------------------------------------------------------


def gradient_group_name(names: Sequence[str]) -> str:
    """A name for a step's gradient group, the same on every rank that has the same variables.

    Example:
        >>> gradient_group_name(["dense/kernel", "dense/bias"])[:23]
        'DistributedGradients.2.'
    """
    digest = zlib.crc32("|".join(names).encode())
    return f"DistributedGradients.{len(names)}.{digest:08x}"


def sparse_name(name: str) -> str:
    """The collective name of a sparse gradient reduced by allgather.

    Example:
        >>> sparse_name("fc.weight")
        'sparse.fc.weight'
    """
    return f"sparse.{name}"


def sparsified_name(name: str) -> str:
    """The collective name of a sparsified gradient's (index, value) pairs.

    Example:
        >>> sparsified_name("fc.weight")
        'sparsified.fc.weight'
    """
    return f"sparsified.{name}"


def bucket_name(index: int) -> str:
    """The collective name of an explicit group of gradients (``num_groups``/``groups``).

    Example:
        >>> bucket_name(1)
        'group.1'
    """
    return f"group.{index}"


def partial_name(part: int) -> str:
    """The collective name of one rotating slice of a partial synchronization.

    Example:
        >>> partial_name(0)
        'partial.0'
    """
    return f"partial.{part}"
