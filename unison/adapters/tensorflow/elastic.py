"""TensorFlowState, TensorFlowKerasState and the Keras elastic callbacks: TensorFlow values as one elastic state.

The callbacks' behaviour lives in plain mixins (`CommitStateLogic`, ...); the classes here put them on
Keras 3's ``Callback``, and `unison.adapters.tf_keras.elastic` on Keras 2's (tf_keras).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

import keras

from ...elastic._state import SnapshotState

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

    from ...elastic._state import State

__all__ = ["CommitStateCallback", "CommitStateLogic", "TensorFlowKerasState", "TensorFlowState",
           "UpdateBatchStateCallback", "UpdateBatchStateLogic", "UpdateEpochStateCallback",
           "UpdateEpochStateLogic"]

# A Python object, the same kind on every rank.
_T = TypeVar("_T")


class _Snapshot(TypedDict):
    """What a TensorFlowState commits."""

    variables: list[np.ndarray]
    values: dict[str, object]


class _KerasSnapshot(TypedDict):
    """What a TensorFlowKerasState commits."""

    model: list[np.ndarray]
    optimizer: list[np.ndarray]
    values: dict[str, object]


class _BatchState(Protocol):
    """What `UpdateBatchStateLogic` needs of its state: a plain value named batch."""

    batch: int


class _EpochState(Protocol):
    """What `UpdateEpochStateLogic` needs of its state: a plain value named epoch."""

    epoch: int


def _broadcast_object(obj: _T, root_rank: int = 0) -> _T:
    from ..._job.objects import broadcast_object

    return broadcast_object(obj, root_rank)


def _rank() -> int:
    from ..._job.runtime import rank

    return rank()


def _assign(variables: Sequence[tf.Variable | keras.Variable], values: Sequence[np.ndarray], what: str) -> None:
    if len(variables) != len(values):
        raise ValueError(f"the committed state has {len(values)} {what}, this process {len(variables)}: "
                         "build the same model and optimizer on every launch")
    for variable, value in zip(variables, values):
        variable.assign(value)


def _variables_of(optimizer: tf.keras.optimizers.Optimizer | None) -> list[tf.Variable | keras.Variable]:
    """The optimizer's variables: a list in Keras 3 and tf_keras, a method of Keras 2's legacy optimizers.

    The rule of `unison.adapters.keras.callback_logic.optimizer_variables`, which the elastic package,
    a floor below the adapters, does not import.
    """
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class _ValuesState(SnapshotState):
    """Plain values (epoch, batch, ...) kept as attributes beside the framework's variables."""

    def _values(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._books.names}

    def _apply_values(self, values: dict[str, object]) -> None:
        for name, value in values.items():
            setattr(self, name, value)


class TensorFlowState(_ValuesState):
    """A list of ``tf.Variable`` and plain values: ``TensorFlowState(variables, epoch=0)``.

    Eager execution only: `session` (TensorFlow 1 graph mode) must be None.
    """

    def __init__(self, variables: Sequence[tf.Variable | keras.Variable] | None = None,
                 session: tf.compat.v1.Session | None = None, **kwargs: object) -> None:
        if session is not None:
            raise ValueError("TensorFlowState(session=...) is TensorFlow 1 graph mode, which unison does not "
                             "support; pass the variables of an eager program")
        if variables is None:
            raise ValueError("TensorFlowState needs its variables: TensorFlowState(variables=[...], ...)")
        super().__init__(_broadcast_object, _rank)
        self.variables = list(variables)
        self._set_values(kwargs)
        self.save()

    def _capture(self) -> _Snapshot:
        return {"variables": [v.numpy() for v in self.variables], "values": self._values()}

    def _apply(self, values: _Snapshot) -> None:
        _assign(self.variables, values["variables"], "variables")
        self._apply_values(values["values"])


class TensorFlowKerasState(_ValuesState):
    """A built Keras model, its optimizer and plain values: ``TensorFlowKerasState(model, epoch=0, batch=0)``."""

    def __init__(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer | None = None,
                 backend: object = None, **kwargs: object) -> None:
        super().__init__(_broadcast_object, _rank)
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        self._set_values(kwargs)
        self.save()

    def _optimizer_variables(self, wanted: int = 0) -> list[tf.Variable | keras.Variable]:
        variables = _variables_of(self.optimizer)
        if wanted > len(variables):
            # Slots are made lazily, at the first step: Keras 3's and tf_keras's `build`, or the
            # `_create_all_weights` of Keras 2's legacy optimizers.
            create = getattr(self.optimizer, "_create_all_weights", None) or getattr(self.optimizer, "build", None)
            if create is not None:
                create(self.model.trainable_variables)
                variables = _variables_of(self.optimizer)
        return variables

    def _capture(self) -> _KerasSnapshot:
        return {"model": self.model.get_weights(),
                "optimizer": [v.numpy() for v in self._optimizer_variables()], "values": self._values()}

    def _apply(self, values: _KerasSnapshot) -> None:
        self.model.set_weights(values["model"])
        if values["optimizer"]:
            _assign(self._optimizer_variables(len(values["optimizer"])), values["optimizer"], "optimizer variables")
        self._apply_values(values["values"])


class CommitStateLogic:
    """Commit `state` every `batches_per_commit` batches and at the end of every epoch."""

    # Set by the Keras Callback the logic is mixed into; params holds fit's settings, of several types.
    model: tf.keras.Model | None
    params: dict[str, Any] | None

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_batch_end(self, batch: int, logs: dict[str, object] | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: dict[str, object] | None = None) -> None:
        self.on_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, object] | None = None) -> None:
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateLogic:
    """Keep ``state.batch`` at the last finished batch; after a reset the first epoch runs only its remaining steps.

    ``state.batch`` is the epoch's index of the last finished batch, 0 at an epoch's end (Horovod's
    meaning). A ``fit`` that starts at ``state.batch`` b > 0 numbers its first epoch's batches from
    b + 1 and ends that epoch after its remaining ``steps - b - 1`` steps: Keras 3 reads no step count
    from the callbacks' ``params``, so the callback sets ``model.stop_training`` and clears it at the
    epoch's end. The data must go on where the committed batches left off (e.g. a repeated dataset
    with ``steps_per_epoch``, started at batch b + 1). A commit after batch 0 reads as the epoch's
    start, so batch 0 runs again; one after the last batch but before the epoch's end runs one step
    more (Keras runs at least one step an epoch).
    """

    # Set by the Keras Callback the logic is mixed into; params holds fit's settings, of several types.
    model: tf.keras.Model | None
    params: dict[str, Any] | None

    def __init__(self, state: _BatchState) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None
        self._first_batch = 0  # the epoch's batch at this fit's batch 0 (after a reset, the next one)
        self._last_batch: int | None = None  # the fit's batch that ends a resumed epoch
        self._stopped = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, object] | None = None) -> None:
        params = self.params if isinstance(self.params, dict) else {}
        self._first_batch, self._last_batch = 0, None
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            done = self.state.batch + 1 if self.state.batch > 0 else 0
            params["steps"] = self.steps_per_epoch - done
            if done:
                self._first_batch, self._last_batch = done, self.steps_per_epoch - done - 1

    def on_batch_end(self, batch: int, logs: dict[str, object] | None = None) -> None:
        self.state.batch = self._first_batch + batch
        model = self.model
        if self._last_batch is not None and batch >= self._last_batch and model is not None and not model.stop_training:
            model.stop_training = self._stopped = True  # a stop another callback asked for stays

    def on_train_batch_end(self, batch: int, logs: dict[str, object] | None = None) -> None:
        self.on_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, object] | None = None) -> None:
        self.state.batch = 0
        self._first_batch, self._last_batch = 0, None
        if self._stopped and self.model is not None:
            self.model.stop_training = self._stopped = False  # only the resumed epoch ends early, not fit


class UpdateEpochStateLogic:
    """Keep ``state.epoch`` at the number of epochs finished since the job began."""

    # Set by the Keras Callback the logic is mixed into; params holds fit's settings, of several types.
    model: tf.keras.Model | None
    params: dict[str, Any] | None

    def __init__(self, state: _EpochState) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict[str, object] | None = None) -> None:
        self.initial_epoch = self.state.epoch  # the restored epoch: fit() counts from 0 again

    def on_epoch_end(self, epoch: int, logs: dict[str, object] | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


class CommitStateCallback(CommitStateLogic, keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of every epoch (Keras 3)."""


class UpdateBatchStateCallback(UpdateBatchStateLogic, keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch (Keras 3); see `UpdateBatchStateLogic`."""


class UpdateEpochStateCallback(UpdateEpochStateLogic, keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs finished since the job began (Keras 3)."""
