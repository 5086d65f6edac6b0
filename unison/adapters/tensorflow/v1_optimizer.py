"""DistributedOptimizer for ``tf.compat.v1.train.Optimizer``: TF1 graphs reduce gradients in compute_gradients.

Horovod's TensorFlow module wraps TF1 optimizers (``tf.compat.v1.train.GradientDescentOptimizer``
and custom subclasses) for graphs run by ``tf.compat.v1.Session``: ``compute_gradients`` (which
``minimize`` calls) returns the gradients reduced across the process set, and ``apply_gradients``
is the wrapped optimizer's. On a rank outside the set the gradients come back unreduced, as in
Horovod. The wrapper is a ``tf.compat.v1.train.Optimizer`` itself, so code that checks the type or
calls ``minimize`` keeps working.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import tensorflow as tf

from ..._job.gradients import Framework, GradientPolicy, gradient_policy
from ...errors import UnisonNotImplementedError
from ...ops import ReduceOp
from ...process_sets import ProcessSet
from .gradients import reduce_gradients

__all__ = ["DistributedV1Optimizer", "distributed_v1_optimizer", "is_v1_optimizer"]


def is_v1_optimizer(optimizer: object) -> bool:
    """True for TF1 optimizers (``tf.compat.v1.train.Optimizer`` and its subclasses)."""
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


class DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """Wraps a TF1 optimizer; `compute_gradients` reduces, everything else is the wrapped optimizer's.

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.001 * hvd.size()))  # doctest: +SKIP
        >>> train_op = opt.minimize(loss)                                                             # doctest: +SKIP
    """

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, policy: GradientPolicy, name: str | None = None,
                 use_locking: bool = False) -> None:
        if policy.backward_passes_per_step != 1:
            raise UnisonNotImplementedError(
                "backward_passes_per_step > 1 is not supported for tf.compat.v1.train optimizers. Got "
                f"backward_passes_per_step={policy.backward_passes_per_step}; wrap a Keras optimizer, "
                "which aggregates passes, or sum the gradients of several passes before compute_gradients."
            )
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer  # Horovod's attribute name: scripts reach the wrapped optimizer by it
        self._unison = policy
        self._local: set[Hashable] = set()
        self._statistics = {"compute_calls": 0, "tensors_reduced": 0}

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self._optimizer).__name__}, op={self._unison.op.name}, "
                f"local_variables={len(self._local)}, calls={self._statistics['compute_calls']})")

    def statistics(self) -> dict[str, int]:
        """Counters: compute_gradients calls and gradients handed to the reduction."""
        return dict(self._statistics)

    def register_local_var(self, var: tf.Variable) -> None:
        """Keep `var`'s gradient local: not reduced (divided by the set size if scale_local_gradients)."""
        self._local.add(var.ref())

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        """The wrapped optimizer's gradients, reduced across the process set (graph ops)."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        if not pairs:
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        self._statistics["compute_calls"] += 1
        self._statistics["tensors_reduced"] += sum(g is not None for g in grads)
        names = _names(variables)
        local = [v.ref() in self._local for v in variables]
        return list(zip(reduce_gradients(self._unison, grads, names, local), variables))

    def apply_gradients(self, grads_and_vars: Any, global_step: tf.Variable | None = None,
                        name: str | None = None) -> tf.Operation:
        """The wrapped optimizer's `apply_gradients` (the gradients are reduced already)."""
        return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def _names(variables: Sequence[tf.Variable]) -> list[str]:
    """The group's names: the variables' graph names, the same on every rank that builds the same graph."""
    return [str(getattr(v, "name", f"var{i}")) for i, v in enumerate(variables)]


def distributed_v1_optimizer(optimizer: tf.compat.v1.train.Optimizer, name: str | None, use_locking: bool,
                             compression: Any, sparse_as_dense: bool, op: ReduceOp | int,
                             gradient_predivide_factor: float, backward_passes_per_step: int,
                             average_aggregated_gradients: bool, process_set: ProcessSet,
                             scale_local_gradients: bool) -> DistributedV1Optimizer:
    """Check the arguments as Horovod's TensorFlow wrapper does and wrap the TF1 optimizer."""
    policy = gradient_policy(Framework.TENSORFLOW, op=op, compression=compression,
                             sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor,
                             backward_passes_per_step=int(backward_passes_per_step),
                             average_aggregated_gradients=average_aggregated_gradients,
                             process_set=process_set, scale_local_gradients=scale_local_gradients)
    return DistributedV1Optimizer(optimizer, policy, name=name, use_locking=use_locking)
