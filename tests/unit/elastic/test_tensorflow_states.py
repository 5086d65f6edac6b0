"""TensorFlowKerasState and UpdateBatchStateCallback in one process: restoring an unbuilt optimizer, resuming an epoch."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(60)

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

STEPS = 8


def _model() -> Any:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    model.compile(keras.optimizers.SGD(0.5, momentum=0.5), loss="mse")
    return model


def test_keras_state_restores_into_a_new_model_whose_optimizer_has_no_slots_yet() -> None:
    from unison.adapters.tensorflow.elastic import TensorFlowKerasState

    trained = _model()
    trained.fit(np.ones((4, 2)), np.zeros((4, 1)), batch_size=2, epochs=1, verbose=0)
    committed = TensorFlowKerasState(trained, epoch=1)._capture()
    fresh = _model()
    assert len(fresh.optimizer.variables) < len(committed["optimizer"])  # built at its first step
    state = TensorFlowKerasState(fresh, epoch=0)
    state._apply(committed)
    assert [w.tolist() for w in fresh.get_weights()] == [w.tolist() for w in trained.get_weights()]
    assert ([np.asarray(v).tolist() for v in fresh.optimizer.variables]
            == [np.asarray(v).tolist() for v in trained.optimizer.variables])
    assert state.epoch == 1
    with pytest.raises(ValueError, match="the committed state has 1 optimizer variables, this process 3"):
        state._apply({**committed, "optimizer": committed["optimizer"][:1]})


class _Steps(keras.callbacks.Callback):
    """The (epoch, state.batch) after each step, and the data each step took."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.batches: list[tuple[int, int]] = []
        self.epochs: list[int] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches.append((len(self.epochs), self.state.batch))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epochs.append(self.state.batch)


@pytest.mark.parametrize(("committed", "first_epoch"), [(3, [4, 5, 6, 7]), (0, list(range(STEPS))),
                                                         (STEPS - 2, [STEPS - 1])])
def test_update_batch_state_resumes_the_epoch_after_the_committed_batch(committed: int, first_epoch: list[int]) -> None:
    from unison.adapters.tensorflow.elastic import UpdateBatchStateCallback

    model = _model()
    state = types.SimpleNamespace(batch=committed)
    steps = _Steps(state)
    data = tf.data.Dataset.from_tensor_slices((np.ones((1, 2, 2)), np.zeros((1, 2, 1)))).repeat()
    history = model.fit(data, steps_per_epoch=STEPS, epochs=2, verbose=0, shuffle=False,
                        callbacks=[UpdateBatchStateCallback(state), steps])
    assert steps.batches == [(0, b) for b in first_epoch] + [(1, b) for b in range(STEPS)]
    assert steps.epochs == [0, 0] and len(history.epoch) == 2  # the early end of epoch 0 did not end fit
    assert model.stop_training is False
    assert int(model.optimizer.iterations) == len(first_epoch) + STEPS


def test_update_batch_state_keeps_a_stop_another_callback_asked_for() -> None:
    from unison.adapters.tensorflow.elastic import UpdateBatchStateCallback

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 3:  # the resumed epoch's last step, where UpdateBatchStateCallback stops it too
                self.model.stop_training = True

    model = _model()
    state = types.SimpleNamespace(batch=3)
    data = tf.data.Dataset.from_tensor_slices((np.ones((1, 2, 2)), np.zeros((1, 2, 1)))).repeat()
    history = model.fit(data, steps_per_epoch=STEPS, epochs=2, verbose=0, shuffle=False,
                        callbacks=[Stop(), UpdateBatchStateCallback(state)])
    assert len(history.epoch) == 1 and int(model.optimizer.iterations) == 4 and model.stop_training is True
