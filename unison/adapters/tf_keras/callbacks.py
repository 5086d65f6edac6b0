"""Keras 2 (tf_keras) callbacks for distributed training: the Keras 3 callbacks' behaviour, on tf_keras's Callback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf
import tf_keras

from ..._job.runtime import job
from ...errors import InvalidArgumentError
from ..keras.callback_logic import (
    BroadcastGlobalVariablesLogic,
    KerasOps,
    LearningRateScheduleLogic,
    LearningRateWarmupLogic,
    MetricAverageLogic,
    schedule_error,
)

if TYPE_CHECKING:
    from ..keras.callback_logic import Logs
    from .optimizer import Keras2Optimizer

__all__ = [
    "BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "KerasBestModelCheckpoint",
    "LearningRateScheduleCallback", "LearningRateWarmupCallback", "MetricAverageCallback",
]

_Schedule = tf_keras.optimizers.schedules.LearningRateSchedule


def _is_legacy(optimizer: object) -> bool:
    return isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer)


class Keras2Ops(KerasOps):
    """tf_keras's values and learning rate; a legacy optimizer's momentum is a variable, so it is corrected."""

    learning_rate_key = "lr"  # Horovod's Keras 2 callbacks log the rate as "lr"

    def to_numpy(self, value: object) -> np.ndarray:
        return np.asarray(tf_keras.backend.get_value(value))

    def learning_rate(self, optimizer: Keras2Optimizer) -> float:
        value = optimizer.learning_rate
        if isinstance(value, _Schedule):
            value = value(optimizer.iterations)
        return float(self.to_numpy(value))

    def set_learning_rate(self, optimizer: Keras2Optimizer, value: float) -> None:
        current = optimizer._hyper.get("learning_rate") if _is_legacy(optimizer) else optimizer._learning_rate
        if isinstance(current, _Schedule):
            raise schedule_error(current)
        optimizer.learning_rate = value

    def momentum(self, optimizer: Keras2Optimizer) -> tf.Variable | None:
        if not _is_legacy(optimizer) or "momentum" not in optimizer._hyper:
            return None  # tf_keras's own optimizers compile momentum as a constant
        # The hyperparameters become variables at the first step otherwise. The iteration counter
        # first, as the first step and a loaded model make them: the variables' order stays the same.
        _ = optimizer.iterations
        optimizer._create_hypers()
        momentum = optimizer._get_hyper("momentum")
        return momentum if isinstance(momentum, tf.Variable) else None


KERAS2_OPS = Keras2Ops()


class BroadcastGlobalVariablesCallback(BroadcastGlobalVariablesLogic, tf_keras.callbacks.Callback):
    """Make every rank go on from `root_rank`'s model and optimizer state (Keras 2).

    Broadcasts the model's and the optimizer's variables after the first batch, when every rank's
    optimizer is built (as Horovod does), each named by its place in the model's or the optimizer's
    list; before the first batch, the model's variables too when every rank has the same ones.

    Example:
        >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])   # doctest: +SKIP
    """

    _keras_ops = KERAS2_OPS


class MetricAverageCallback(MetricAverageLogic, tf_keras.callbacks.Callback):
    """At each epoch's end, replace every metric in `logs` by its average over ranks (Keras 2).

    Place it before callbacks that read metrics (ReduceLROnPlateau, TensorBoard, checkpoints).
    """


class LearningRateScheduleCallback(LearningRateScheduleLogic, tf_keras.callbacks.Callback):
    """Set ``lr = initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch) (Keras 2).

    A constant `multiplier` holds the rate at ``initial_lr * multiplier`` over the range (Horovod's
    step schedule). With ``staircase=False`` the epoch is fractional and updated every batch. With
    `momentum_correction`, a legacy optimizer's momentum is scaled by new/old rate for the batch
    that changes the rate, as Horovod does. The rate is logged as ``lr``.
    """

    _keras_ops = KERAS2_OPS


class LearningRateWarmupCallback(LearningRateWarmupLogic, tf_keras.callbacks.Callback):
    """Ramp the learning rate linearly from ``initial_lr / size`` to `initial_lr` over `warmup_epochs` (Keras 2).

    Example:
        >>> hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3)   # doctest: +SKIP
    """

    _keras_ops = KERAS2_OPS


class BestModelCheckpoint(tf_keras.callbacks.ModelCheckpoint):
    """Save the model whenever `monitor` improves (``save_best_only=True``), on rank 0 only (Keras 2).

    Horovod's signature has no file path (its Spark estimator sets ``filepath`` after construction);
    pass ``filepath=`` here or set the attribute before training (``best.h5``, ``best.keras`` or a
    SavedModel directory, as tf_keras's ModelCheckpoint takes). Only rank 0 writes.

    Example:
        >>> checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath="best.h5")  # doctest: +SKIP
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: str | int = "epoch", *, filepath: str | None = None) -> None:
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if not self.filepath:
            raise InvalidArgumentError(
                "BestModelCheckpoint needs a file path to save to: pass filepath='best.h5' (or "
                "'best.keras'), or set checkpoint.filepath before model.fit. Got filepath=None."
            )
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if job().rank == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if job().rank == 0:
            super().on_epoch_end(epoch, logs)


class KerasBestModelCheckpoint(BestModelCheckpoint):
    """`BestModelCheckpoint` with horovod.keras's positional order, which has no `save_weights_only`
    (given here by keyword only). ``unison.keras.callbacks.BestModelCheckpoint`` is this class under Keras 2.

    Example:
        >>> hvd.callbacks.BestModelCheckpoint("val_loss", 1, "min", filepath="best.h5")   # doctest: +SKIP
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: str | int = "epoch", *, save_weights_only: bool = False,
                 filepath: str | None = None) -> None:
        super().__init__(monitor, verbose, save_weights_only, mode, save_freq, filepath=filepath)
