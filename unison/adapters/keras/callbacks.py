"""Keras 3 callbacks for distributed training: broadcast initial state, average metrics, schedule the learning rate."""

from __future__ import annotations

import keras
import numpy as np

from .callback_logic import (
    BroadcastGlobalVariablesLogic,
    KerasOps,
    LearningRateScheduleLogic,
    LearningRateWarmupLogic,
    MetricAverageLogic,
    schedule_error,
)

__all__ = [
    "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


class Keras3Ops(KerasOps):
    """Keras 3's values and learning rate; momentum is a compiled constant, so it is never corrected."""

    def to_numpy(self, value: object) -> np.ndarray:
        return np.asarray(keras.ops.convert_to_numpy(getattr(value, "value", value)))

    def learning_rate(self, optimizer: keras.optimizers.Optimizer) -> float:
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    def set_learning_rate(self, optimizer: keras.optimizers.Optimizer, value: float) -> None:
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise schedule_error(optimizer._learning_rate)
        optimizer.learning_rate = value


KERAS3_OPS = Keras3Ops()


class BroadcastGlobalVariablesCallback(BroadcastGlobalVariablesLogic, keras.callbacks.Callback):
    """Make every rank go on from `root_rank`'s model and optimizer state.

    Broadcasts the model's and the optimizer's variables after the first batch, when every rank's
    optimizer is built (as Horovod does), each named by its place in the model's or the optimizer's
    list; before the first batch, the model's variables too when every rank has the same ones.

    Example:
        >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])   # doctest: +SKIP
    """

    _keras_ops = KERAS3_OPS


class MetricAverageCallback(MetricAverageLogic, keras.callbacks.Callback):
    """At each epoch's end, replace every metric in `logs` by its average over ranks (one group).

    Place it before callbacks that read metrics (ReduceLROnPlateau, TensorBoard, checkpoints).
    """


class LearningRateScheduleCallback(LearningRateScheduleLogic, keras.callbacks.Callback):
    """Set ``learning_rate = initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    A constant `multiplier` holds the rate at ``initial_lr * multiplier`` over the range (Horovod's
    step schedule). With ``staircase=False`` the epoch is fractional and updated every batch.
    `momentum_correction` is accepted but has no effect: Keras 3 compiles momentum as a constant.
    """

    _keras_ops = KERAS3_OPS


class LearningRateWarmupCallback(LearningRateWarmupLogic, keras.callbacks.Callback):
    """Ramp the learning rate linearly from ``initial_lr / size`` to `initial_lr` over `warmup_epochs`.

    Goyal et al. (2017): start small when the global batch is large. Values match Horovod's.

    Example:
        >>> hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3)   # doctest: +SKIP
    """

    _keras_ops = KERAS3_OPS
