"""SyncBatchNormalization: a Keras BatchNormalization whose batch statistics are averaged across ranks."""

from __future__ import annotations

import keras
import tensorflow as tf

from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from ...process_sets import global_process_set
from .collectives import _allreduce_group

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with mean and variance over the global batch (TensorFlow backend).

    Each rank computes its batch mean and mean of squares; one allreduce averages them (ranks are
    assumed to use equal batch sizes, as in Horovod). Masks are not supported.

    Example:
        >>> layer = hvd.SyncBatchNormalization()   # doctest: +SKIP
    """

    def __init__(self, fused: bool | None = False, **kwargs: object) -> None:
        if fused in (True, None):
            raise InvalidArgumentError("SyncBatchNormalization does not support fused=True.")
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)

    @tf.autograph.experimental.do_not_convert
    def _moments(self, inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        if mask is not None:
            raise InvalidArgumentError("SyncBatchNormalization does not support masks.")
        axes = list(self._reduction_axes)
        wide = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        mean = tf.reduce_mean(wide, axis=axes)
        mean_square = tf.reduce_mean(tf.square(wide), axis=axes)
        name = None if tf.executing_eagerly() else f"{self.name}_moments"
        stacked = _allreduce_group([tf.stack([mean, mean_square])], ReduceOp.AVERAGE, 1.0, 1.0, name,
                                   global_process_set, grouped=False)[0]
        global_mean, global_square = stacked[0], stacked[1]
        variance = tf.maximum(global_square - tf.square(global_mean), 0.0)
        return tf.cast(global_mean, inputs.dtype), tf.cast(variance, inputs.dtype)
