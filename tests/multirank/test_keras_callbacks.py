"""The Keras callbacks' effects across ranks, and save/load of a model compiled with the wrapped optimizer."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison  # noqa: E402
import unison.keras as hvd  # noqa: E402
from unison.adapters.keras.optimizer import is_distributed  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def model_for_rank(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def xy(rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(hvd.rank())
    return rng.randn(rows, 3).astype(np.float32), rng.randn(rows, 2).astype(np.float32)


class Recorder(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.lrs: list[float] = []
        self.epoch_logs: list[dict] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def test_broadcast_callback_makes_weights_equal() -> None:
    model = model_for_rank(100 + hvd.rank())
    root_weights = hvd.broadcast(model.get_weights()[0], root_rank=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = xy()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    np.testing.assert_array_equal(model.get_weights()[0], keras.ops.convert_to_numpy(root_weights))


def test_metric_average_callback_averages_logs() -> None:
    model = model_for_rank(1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    raw, averaged = Recorder(), Recorder()
    x, y = xy()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    local = raw.epoch_logs[0]["loss"]
    losses = unison.allgather_object(local)
    assert len(set(losses)) == hvd.size()  # each rank's data differs, so the raw losses do too
    assert averaged.epoch_logs[0]["loss"] == pytest.approx(float(np.mean(losses)), rel=1e-6)


def test_warmup_callback_values() -> None:
    model = model_for_rank(1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    recorder = Recorder()
    x, y = xy(rows=8)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2), recorder])
    n = hvd.size()
    # Horovod's formula: lr = initial/size * (e * (size - 1) / warmup + 1), e = epoch + (batch + 1) / steps
    expected = [0.1 / n * ((epoch + (batch + 1) / 2) * (n - 1) / 2 + 1) for epoch in range(2) for batch in range(2)]
    np.testing.assert_allclose(recorder.lrs[:4], expected, rtol=1e-6)
    assert recorder.lrs[3] == pytest.approx(0.1)
    assert recorder.lrs[4:] == pytest.approx([0.1, 0.1])  # after warmup the rate stays


def test_schedule_callback_constant_multiplier() -> None:
    model = model_for_rank(1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2)), loss="mse")
    recorder = Recorder()
    x, y = xy(rows=8)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5, start_epoch=1, end_epoch=2),
        recorder])
    assert recorder.lrs == pytest.approx([0.2, 0.2, 0.1, 0.1, 0.1, 0.1])
    assert recorder.epoch_logs[1]["learning_rate"] == pytest.approx(0.1)


def test_schedule_callback_refuses_schedule_objects() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model = model_for_rank(1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(schedule)), loss="mse")
    x, y = xy()
    with pytest.raises(ValueError, match=r"uses a LearningRateSchedule \(ExponentialDecay\)"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5)])


def test_save_and_load_with_wrapped_optimizer(tmp_path) -> None:
    model = model_for_rank(3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = xy()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer).__name__ == "Adam" and not is_distributed(plain.optimizer)
    again = hvd.load_model(path)
    assert is_distributed(again.optimizer) and isinstance(again.optimizer, keras.optimizers.Adam)
    assert int(again.optimizer.iterations.numpy()) == 2
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.optimizer.variables, again.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    again.fit(x, y, batch_size=4, epochs=1, verbose=0)  # the reloaded model keeps training distributed
    assert again.optimizer.statistics()["apply_calls"] >= 1
