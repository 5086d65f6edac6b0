"""Horovod's TensorFlow-level optimizer entry points, mapped onto Keras 3 (TF1 graph mode is gone)."""

from __future__ import annotations

from typing import Any

__all__ = ["DistributedOptimizer", "broadcast_global_variables"]


def DistributedOptimizer(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    """Wrap a Keras 3 optimizer (same as ``unison.keras.DistributedOptimizer``).

    TF1 ``tf.compat.v1.train.Optimizer`` objects are not supported: use a Keras optimizer, or
    `DistributedGradientTape` in a custom loop.
    """
    from ..keras.optimizer import DistributedOptimizer as keras_distributed_optimizer

    return keras_distributed_optimizer(optimizer, *args, **kwargs)


def broadcast_global_variables(root_rank: int) -> None:
    """TF1 only in Horovod; TensorFlow 2 runs eagerly, so this always raises."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support eager execution. Please use "
        "`hvd.broadcast_variables(<model/optimizer variables>)` instead."
    )
