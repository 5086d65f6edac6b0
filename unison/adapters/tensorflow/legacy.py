"""Horovod's TF1 entry points: what ``tf.compat.v1`` graphs use, and what eager TensorFlow refuses.

``unison.tensorflow.DistributedOptimizer`` wraps Keras optimizers (Keras 3's, and Keras 2's through
tf_keras) and, in ``tf.compat.v1`` graphs, ``tf.compat.v1.train.Optimizer`` objects
(`unison.adapters.tensorflow.v1_optimizer`).
"""

from __future__ import annotations

import tensorflow as tf

from ._bridge import executing_eagerly
from .functions import broadcast_variables

__all__ = ["broadcast_global_variables"]


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """Return an op that assigns every global variable of the graph `root_rank`'s value (TF1 graphs).

    Eagerly there is no graph of global variables: it raises `RuntimeError`, as Horovod does.

    Example:
        >>> with tf.compat.v1.Session() as session:   # doctest: +SKIP
        ...     session.run(hvd.broadcast_global_variables(0))
    """
    if executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    op = broadcast_variables(tf.compat.v1.global_variables(), root_rank)
    return tf.no_op() if op is None else op
