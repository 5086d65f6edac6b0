"""Horovod's TF1-only entry points, which TensorFlow 2 (always eager at the top level) cannot honour.

``unison.tensorflow.DistributedOptimizer`` is the Keras 3 optimizer wrapper, re-exported by the public
module: TF1 ``tf.compat.v1.train.Optimizer`` objects are not supported; use a Keras optimizer, or
`DistributedGradientTape` in a custom loop.
"""

from __future__ import annotations

__all__ = ["broadcast_global_variables"]


def broadcast_global_variables(root_rank: int) -> None:
    """TF1 only in Horovod; TensorFlow 2 runs eagerly, so this always raises."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support eager execution. Please use "
        "`hvd.broadcast_variables(<model/optimizer variables>)` instead."
    )
