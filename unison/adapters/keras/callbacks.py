"""Keras 3 callbacks for distributed training: broadcast initial state, average metrics, schedule the learning rate."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from ... import _collectives as C
from ... import _submit as S
from ..._runtime import job
from ...errors import InvalidArgumentError
from ...ops import ReduceOp

__all__ = [
    "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
    "MetricAverageCallback", "broadcast_variables_numpy",
]


def broadcast_variables_numpy(variables: list[Any], root_rank: int, name: str) -> None:
    """Assign every Keras variable `root_rank`'s value (all broadcasts in flight at once); any backend."""
    handles = [C.broadcast_async(np.ascontiguousarray(keras.ops.convert_to_numpy(v.value)), root_rank,
                                 name=f"{name}.{i}") for i, v in enumerate(variables)]
    for v, handle in zip(variables, handles):
        v.assign(np.reshape(S.synchronize(handle), v.shape))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from `root_rank`'s model and optimizer state.

    Broadcasts at the start of training (Keras 3 builds the optimizer before the first batch) and,
    if the optimizer was not built yet then, again after the first batch, as Horovod does.

    Example:
        >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])   # doctest: +SKIP
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False
        self.broadcasts = 0

    def __repr__(self) -> str:
        return f"BroadcastGlobalVariablesCallback(root_rank={self.root_rank}, broadcasts={self.broadcasts})"

    def _broadcast(self) -> None:
        local = {id(v) for v in self.local_variables}
        variables = [v for v in self.model.variables if id(v) not in local]
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            variables += list(optimizer.variables)
        broadcast_variables_numpy(variables, self.root_rank, f"BroadcastGlobalVariables.{len(variables)}")
        self.broadcasts += 1

    def on_train_begin(self, logs: Any = None) -> None:
        self._broadcast()
        optimizer = getattr(self.model, "optimizer", None)
        self.broadcast_done = optimizer is None or optimizer.built

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.broadcast_done:
            self._broadcast()
            self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, replace every metric in `logs` by its average over ranks (one group).

    Place it before callbacks that read metrics (ReduceLROnPlateau, TensorBoard, checkpoints).
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        if not names:
            return
        values = [np.array(float(logs[k]), dtype=np.float64) for k in names]
        key = zlib.crc32("|".join(names).encode())
        averaged = C.grouped_allreduce(values, name=f"MetricAverage.{len(names)}.{key:08x}",
                                       op=ReduceOp.AVERAGE)
        for key, value in zip(names, averaged):
            logs[key] = float(np.reshape(value, ()))


def _set_learning_rate(optimizer: Any, value: float) -> None:
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise InvalidArgumentError(
            "The learning-rate callbacks set optimizer.learning_rate, but this optimizer uses a "
            f"LearningRateSchedule ({type(optimizer._learning_rate).__name__}). Use either the "
            "schedule or the callback."
        )
    optimizer.learning_rate = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set ``learning_rate = initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    A constant `multiplier` holds the rate at ``initial_lr * multiplier`` over the range (Horovod's
    step schedule). With ``staircase=False`` the epoch is fractional and updated every batch.
    `momentum_correction` is accepted but has no effect: Keras 3 compiles momentum as a constant.
    """

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        if not callable(multiplier):
            self.staircase = True
            constant = float(multiplier)
            self.multiplier: Callable[[float], float] = lambda epoch: constant
        else:
            self.multiplier = multiplier

    def _adjust(self, epoch: float) -> None:
        _set_learning_rate(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_train_begin(self, logs: Any = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise InvalidArgumentError(
                    "Could not autodetect the number of steps per epoch; pass steps_per_epoch= to "
                    "the learning-rate callback."
                )

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self._steps())

    def _steps(self) -> int:
        if not self.steps_per_epoch:  # set by on_train_begin, which raises if it cannot find it
            raise ValueError("steps_per_epoch is unknown; pass steps_per_epoch= to the callback.")
        return int(self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate linearly from ``initial_lr / size`` to `initial_lr` over `warmup_epochs`.

    Goyal et al. (2017): start small when the global batch is large. Values match Horovod's.

    Example:
        >>> hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3)   # doctest: +SKIP
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            # Shifted by one batch so that the end of each epoch lands on a round value, as in Horovod.
            epoch += 1.0 / self._steps()
            size = job().size
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            # User-facing progress output, worded and placed as Horovod's (after Keras's progress bar).
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")
