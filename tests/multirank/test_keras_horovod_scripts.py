"""What Horovod's Keras scripts do, under Keras 3: compile's Keras 2 argument, the warmup message, BestModelCheckpoint."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison.keras as hvd  # noqa: E402
import unison.tensorflow.keras.callbacks as tf_keras_callbacks  # noqa: E402
from unison.adapters.keras import optimizer as optimizer_module  # noqa: E402
from unison.errors import InvalidArgumentError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def model() -> keras.Model:
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def xy(rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(hvd.rank())
    return rng.randn(rows, 3).astype(np.float32), rng.randn(rows, 1).astype(np.float32)


def test_compile_drops_experimental_run_tf_function_with_one_warning(monkeypatch) -> None:
    monkeypatch.setattr(optimizer_module, "_warned_arguments", set())
    m = model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                      experimental_run_tf_function=False)
    mine = [w for w in caught if "experimental_run_tf_function" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert str(mine[0].message).startswith(
        "unison: model.compile(experimental_run_tf_function=False) is a Keras 2 argument that Keras 3 "
        "does not accept; unison drops it")
    assert mine[0].filename == __file__  # it points at the user's compile call
    x, y = xy()
    history = m.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_warmup_with_verbose_prints_horovods_message(capsys) -> None:
    def fit(verbose: int) -> str:
        m = model()
        m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2, verbose=verbose)
        x, y = xy()
        capsys.readouterr()
        m.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[warmup])
        return capsys.readouterr().out

    assert fit(verbose=1) == "\nEpoch 2: finished gradual learning rate warmup to 0.1.\n"
    assert fit(verbose=0) == ""


def test_best_model_checkpoint_saves_the_best_model_on_rank_0_only(tmp_path) -> None:
    path = str(tmp_path / "best.keras")  # each rank's own directory
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss", mode="min", filepath=path)
    assert checkpoint.save_best_only is True and checkpoint.filepath == path
    x, y = xy()
    history = m.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[checkpoint])
    assert os.path.exists(path) == (hvd.rank() == 0)
    if hvd.rank() == 0:
        assert checkpoint.best == pytest.approx(min(history.history["loss"]))
        assert keras.models.load_model(path).count_params() == m.count_params()


def test_best_model_checkpoint_takes_horovods_positional_orders(tmp_path) -> None:
    keras_order = hvd.callbacks.BestModelCheckpoint("loss", 1, "max", 2)
    assert (keras_order.monitor, keras_order.verbose, keras_order.mode, keras_order.save_freq) == ("loss", 1, "max", 2)
    assert keras_order.save_weights_only is False and keras_order.filepath is None
    tf_order = tf_keras_callbacks.BestModelCheckpoint("loss", 0, True, "min", "epoch")
    assert (tf_order.save_weights_only, tf_order.mode, tf_order.save_freq) == (True, "min", "epoch")


def test_best_model_checkpoint_without_a_path_says_how_to_give_one() -> None:
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = xy()
    with pytest.raises(InvalidArgumentError, match=r"BestModelCheckpoint needs a file path to save to: pass "
                       r"filepath='best.keras' .* or set checkpoint.filepath before model.fit. Got filepath=None."):
        m.fit(x, y, epochs=1, verbose=0, callbacks=[hvd.callbacks.BestModelCheckpoint()])


def test_keras_collectives_keep_the_values_shape_as_horovod_does() -> None:
    """``hvd.broadcast(0, 0)`` is 0-d, so ``model.fit(initial_epoch=hvd.broadcast(resume_from_epoch, 0))`` works."""
    epoch = hvd.broadcast(3 if hvd.rank() == 0 else 0, 0)
    assert tuple(epoch.shape) == () and int(epoch) == 3 and keras.backend.standardize_dtype(epoch.dtype) == "int32"
    mean = hvd.allreduce(1.0)
    assert tuple(mean.shape) == () and keras.backend.standardize_dtype(mean.dtype) == "float32"
    assert float(mean) == 1.0
    assert tuple(hvd.broadcast(tf.constant(0), 0).shape) == ()
    assert tuple(hvd.allreduce(np.ones((2, 3), np.float64), op=hvd.Sum).shape) == (2, 3)
    assert tuple(hvd.allgather(hvd.rank()).shape) == (hvd.size(),)  # a scalar is one row, as before
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    assert m.fit(*xy(), epochs=4, initial_epoch=epoch, verbose=0).epoch == [3]
