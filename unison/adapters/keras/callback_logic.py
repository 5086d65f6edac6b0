"""What unison's Keras callbacks do, written once: the Keras 3 and Keras 2 (tf_keras) callback classes mix it in.

Each concrete class puts one of these mixins before its Keras's ``Callback`` and sets ``_keras_ops``
to a `KerasOps`: the few places where the two Kerases differ (reading values, the learning rate, a
momentum that can change between batches, the log key of the learning rate). Nothing here imports
a Keras.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..._job import collectives as C
from ..._job import objects as _objects
from ..._job import submit as S
from ..._job.runtime import job
from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from .naming import Shaped, variable_keys

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy.typing as npt

    #: A callback's logs as Keras fills them: a float per metric, an array where a metric is not a scalar.
    Logs: TypeAlias = dict[str, float | np.ndarray]

__all__ = [
    "BroadcastGlobalVariablesLogic", "KerasOps", "LearningRateScheduleLogic", "LearningRateWarmupLogic",
    "MetricAverageLogic", "broadcast_variables_numpy", "optimizer_variables",
]

log = logging.getLogger(__name__)

_BROADCAST = "BroadcastGlobalVariables"


class _Variable(Shaped, Protocol):
    """What the callbacks use of either Keras's variable: shape and dtype (its broadcast's name), `assign`."""

    def assign(self, value: npt.ArrayLike) -> object: ...


class _Optimizer(Protocol):
    """What the callbacks use of either Keras's optimizer: its variables (a method in Keras 2's legacy)."""

    @property
    def variables(self) -> Sequence[_Variable] | Callable[[], Sequence[_Variable]]: ...


class _Model(Protocol):
    """What the callbacks use of either Keras's model."""

    @property
    def variables(self) -> Sequence[_Variable]: ...

    @property
    def optimizer(self) -> _Optimizer: ...


class KerasOps:
    """What differs between the Kerases, for the callbacks; each Keras's adapter subclasses it."""

    #: The key under which the learning-rate callbacks log the rate at an epoch's end.
    learning_rate_key = "learning_rate"

    def to_numpy(self, value: object) -> np.ndarray:
        """Return a variable's or tensor's value as a NumPy array."""
        raise NotImplementedError

    def learning_rate(self, optimizer: _Optimizer) -> float:
        """Return the optimizer's current learning rate."""
        raise NotImplementedError

    def set_learning_rate(self, optimizer: _Optimizer, value: float) -> None:
        """Set the optimizer's learning rate; raise if it follows a schedule."""
        raise NotImplementedError

    def momentum(self, optimizer: _Optimizer) -> _Variable | None:
        """Return the optimizer's momentum if a step reads it anew each batch (a variable), else None."""
        return None


def optimizer_variables(optimizer: _Optimizer | None) -> list[_Variable]:
    """The optimizer's variables: a list in Keras 3 and tf_keras, a method of Keras 2's legacy optimizers."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def broadcast_variables_numpy(variables: Sequence[_Variable], names: Sequence[str], root_rank: int,
                              to_numpy: Callable[[_Variable], np.ndarray]) -> None:
    """Assign every variable `root_rank`'s value, one named broadcast each, all in flight at once."""
    handles = [C.broadcast_async(np.asarray(to_numpy(v), order="C"), root_rank, name=name)
               for v, name in zip(variables, names)]
    for v, handle in zip(variables, handles):
        v.assign(np.reshape(S.synchronize(handle), tuple(v.shape)))


class BroadcastGlobalVariablesLogic:
    """Make every rank go on from `root_rank`'s model and optimizer state (mixed into a Keras Callback).

    After the first batch, when every rank's optimizer has made its variables, the model's and the
    optimizer's variables are broadcast, as Horovod does. Each broadcast is named by its variable's
    place, shape and dtype in the model's or the optimizer's list (`naming.variable_keys`), so ranks
    that built the same model agree even when one of them loaded it from a file (its optimizer
    built, its layers named as saved) and the others built it afresh. Before the first batch the model's variables alone are broadcast too, when every
    rank has the same ones (a model without an input shape has none yet), so that the first step
    already starts from the root's weights.
    """

    _keras_ops: KerasOps
    model: _Model

    def __init__(self, root_rank: int, device: str = "",
                 local_variables: Iterable[object] | None = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False
        self.broadcasts = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root_rank={self.root_rank}, broadcasts={self.broadcasts})"

    def _model_variables(self) -> list[_Variable]:
        if not getattr(self.model, "built", True):
            return []  # a model without an input shape before its first batch (Keras 2 would raise)
        local = {id(v) for v in self.local_variables}
        return [v for v in self.model.variables if id(v) not in local]

    def _broadcast(self, variables: list[_Variable], names: list[str]) -> None:
        broadcast_variables_numpy(variables, names, self.root_rank, self._keras_ops.to_numpy)
        self.broadcasts += 1

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if self.broadcast_done:
            return
        variables = self._model_variables()
        signatures = _objects.allgather_object(variable_keys(variables), name=f"{_BROADCAST}.signatures")
        if all(s == signatures[0] for s in signatures):
            self._broadcast(variables, [f"{_BROADCAST}.model.{key}" for key in variable_keys(variables)])
        else:
            log.debug("the ranks' models differ before the first batch (%s variables); the broadcast "
                      "waits for the end of the first batch", [len(s) for s in signatures])

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self.broadcast_done:
            return
        model_variables = self._model_variables()
        slots = optimizer_variables(getattr(self.model, "optimizer", None))
        self._broadcast(model_variables + slots,
                        [f"{_BROADCAST}.model.{key}" for key in variable_keys(model_variables)]
                        + [f"{_BROADCAST}.optimizer.{key}" for key in variable_keys(slots)])
        self.broadcast_done = True


class MetricAverageLogic:
    """At each epoch's end, replace every metric in `logs` by its average over ranks (one group).

    Place it before callbacks that read metrics (ReduceLROnPlateau, TensorBoard, checkpoints).
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        if not names:
            return
        values = [np.array(float(logs[k]), dtype=np.float64) for k in names]
        key = zlib.crc32("|".join(names).encode())
        averaged = C.grouped_allreduce(values, name=f"MetricAverage.{len(names)}.{key:08x}",
                                       op=ReduceOp.AVERAGE)
        for name, value in zip(names, averaged):
            logs[name] = float(np.reshape(value, ()))


class LearningRateScheduleLogic:
    """Set ``learning_rate = initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    A constant `multiplier` holds the rate at ``initial_lr * multiplier`` over the range (Horovod's
    step schedule). With ``staircase=False`` the epoch is fractional and updated every batch. With
    `momentum_correction`, a momentum that the optimizer reads anew each step (Keras 2's legacy
    optimizers) is scaled by new/old learning rate for the batch that changes the rate, as Horovod
    does; Keras 3 and tf_keras's own optimizers compile momentum as a constant, so there it has no effect.
    """

    _keras_ops: KerasOps
    model: _Model
    params: dict[str, int | None] | None  # Keras's fit parameters: verbose, epochs, steps

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
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
        self.restore_momentum: float | None = None
        if not callable(multiplier):
            self.staircase = True
            constant = float(multiplier)
            self.multiplier: Callable[[float], float] = lambda epoch: constant
        else:
            self.multiplier = multiplier

    def _adjust(self, epoch: float) -> None:
        ops, optimizer = self._keras_ops, self.model.optimizer
        new_lr = self.initial_lr * self.multiplier(epoch)
        momentum = ops.momentum(optimizer) if self.momentum_correction else None
        old_lr = ops.learning_rate(optimizer) if momentum is not None else 0.0
        ops.set_learning_rate(optimizer, new_lr)
        if momentum is not None and old_lr:
            self.restore_momentum = float(ops.to_numpy(momentum))
            momentum.assign(self.restore_momentum * new_lr / old_lr)

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = self._keras_ops.learning_rate(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise InvalidArgumentError(
                    "Could not autodetect the number of steps per epoch; pass steps_per_epoch= to "
                    "the learning-rate callback."
                )

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Logs | None = None) -> None:
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self._steps())

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if self.restore_momentum is not None:
            momentum = self._keras_ops.momentum(self.model.optimizer)
            if momentum is not None:
                momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def _steps(self) -> int:
        if not self.steps_per_epoch:  # set by on_train_begin, which raises if it cannot find it
            raise ValueError("steps_per_epoch is unknown; pass steps_per_epoch= to the callback.")
        return int(self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if logs is not None:
            logs[self._keras_ops.learning_rate_key] = self._keras_ops.learning_rate(self.model.optimizer)


class LearningRateWarmupLogic(LearningRateScheduleLogic):
    """Ramp the learning rate linearly from ``initial_lr / size`` to `initial_lr` over `warmup_epochs`.

    Goyal et al. (2017): start small when the global batch is large. Values match Horovod's.
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

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            lr = self._keras_ops.learning_rate(self.model.optimizer)
            # User-facing progress output, worded and placed as Horovod's (after Keras's progress bar).
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")


def schedule_error(schedule: object) -> InvalidArgumentError:
    """The error for a learning-rate callback on an optimizer that follows a LearningRateSchedule."""
    return InvalidArgumentError(
        "The learning-rate callbacks set optimizer.learning_rate, but this optimizer uses a "
        f"LearningRateSchedule ({type(schedule).__name__}). Use either the schedule or the callback."
    )
