"""SyncBatchNormalization for Keras 2 (tf_keras): batch statistics averaged across ranks, in tf_keras models.

``hvd.SyncBatchNormalization`` of `unison.tensorflow` is this class when ``tf.keras`` is Keras 2
(``TF_USE_LEGACY_KERAS=1`` with tf-keras installed), so it goes into tf_keras models and runs in
``tf.compat.v1`` graphs as Horovod's does; under Keras 3 it is the Keras 3 layer
(`unison.adapters.tensorflow.sync_batch_norm`). The two compute the same statistics.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from ...process_sets import global_process_set
from ..tensorflow._bridge import executing_eagerly, graph_name
from ..tensorflow.collectives import _allreduce_group

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
    """Batch normalization with mean and variance over the global batch (Keras 2).

    Each rank computes its batch mean and mean of squares; one allreduce averages them (ranks are
    assumed to use equal batch sizes, as in Horovod). Masks are not supported.

    Example:
        >>> layer = hvd.SyncBatchNormalization(axis=1)   # doctest: +SKIP
    """

    def __init__(self, fused: bool | None = False, **kwargs: object) -> None:
        if fused in (True, None):
            raise InvalidArgumentError("SyncBatchNormalization does not support fused=True.")
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(fused=False, **kwargs)

    @tf.autograph.experimental.do_not_convert
    def _calculate_mean_and_var(self, inputs: tf.Tensor, reduction_axes: list[int], keep_dims: bool,
                                mask: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        if mask is not None:
            raise InvalidArgumentError("SyncBatchNormalization does not support masks.")
        wide = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        mean = tf.reduce_mean(wide, axis=reduction_axes, keepdims=keep_dims)
        mean_square = tf.reduce_mean(tf.square(wide), axis=reduction_axes, keepdims=keep_dims)
        name = None if executing_eagerly() else graph_name("HorovodSyncBatchNorm", f"{self.name}_moments")
        stacked = _allreduce_group([tf.stack([mean, mean_square])], ReduceOp.AVERAGE, 1.0, 1.0, name,
                                   global_process_set, grouped=False)[0]
        global_mean, global_square = stacked[0], stacked[1]
        variance = tf.maximum(global_square - tf.square(global_mean), 0.0)
        return tf.cast(global_mean, inputs.dtype), tf.cast(variance, inputs.dtype)
