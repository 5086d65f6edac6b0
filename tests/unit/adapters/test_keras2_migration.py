"""The Keras 2 edits that Horovod's Keras scripts need under Keras 3, as docs/migrating-from-horovod.md lists them.

Each test pins one row of the guide's table: the Keras 2 spelling fails (or is gone) under Keras 3,
and the replacement works. They run in one process without a job: none of them communicates.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import unison.keras  # noqa: E402, F401  (installs unison's compile hook, as in a script)
from unison.adapters.keras import optimizer as optimizer_module  # noqa: E402


def model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def data() -> tuple[np.ndarray, np.ndarray]:
    return np.ones((8, 2), np.float32), np.ones((8, 1), np.float32)


def test_tf_keras_is_keras_3() -> None:
    assert keras.__version__.startswith("3.")
    assert tf.keras.optimizers.SGD is keras.optimizers.SGD


def test_optimizer_variables_is_a_property() -> None:
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model().trainable_variables)
    assert isinstance(opt.variables, list) and opt.variables
    with pytest.raises(TypeError, match="not callable"):
        opt.variables()  # Keras 2: opt.variables()


def test_lr_is_learning_rate() -> None:
    with pytest.raises(ValueError, match=r"Argument\(s\) not recognized: \{'lr': 0.1\}"):
        keras.optimizers.SGD(lr=0.1)
    opt = keras.optimizers.SGD(learning_rate=0.1)
    assert not hasattr(opt, "lr")
    opt.learning_rate = 0.05  # Keras 2: K.set_value(opt.lr, 0.05)
    assert float(keras.ops.convert_to_numpy(opt.learning_rate)) == pytest.approx(0.05)


def test_backend_get_value_and_set_value_are_gone() -> None:
    assert not hasattr(keras.backend, "get_value") and not hasattr(keras.backend, "set_value")


def test_legacy_optimizers_are_gone() -> None:
    with pytest.raises(ImportError, match="`keras.optimizers.legacy` is not supported in Keras 3"):
        keras.optimizers.legacy.SGD(0.1)


def test_fit_generator_is_fit() -> None:
    for name in ("fit_generator", "evaluate_generator", "predict_generator"):
        assert not hasattr(keras.Model, name)

    def batches():
        x, y = data()
        while True:
            yield x[:4], y[:4]

    m = model()
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = m.fit(batches(), steps_per_epoch=2, epochs=1, verbose=0)  # Keras 2: fit_generator
    assert len(history.history["loss"]) == 1


def test_saving_needs_a_keras_file_name(tmp_path) -> None:
    m = model()
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ValueError, match="Invalid filepath extension for saving"):
        m.save(str(tmp_path / "saved_model_dir"))  # Keras 2: a SavedModel directory
    m.save(str(tmp_path / "model.keras"))
    assert keras.models.load_model(str(tmp_path / "model.keras")).count_params() == m.count_params()


def test_experimental_run_tf_function_is_dropped_with_one_warning(monkeypatch) -> None:
    monkeypatch.setattr(optimizer_module, "_warned_arguments", set())
    m = model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", experimental_run_tf_function=False)
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", experimental_run_tf_function=False)
    mine = [str(w.message) for w in caught if "experimental_run_tf_function" in str(w.message)]
    assert mine == [
        "unison: model.compile(experimental_run_tf_function=False) is a Keras 2 argument that Keras 3 does "
        "not accept; unison drops it (it changes nothing with unison's DistributedOptimizer). Remove it "
        "from the call to silence this warning."]
    assert m.fit(*data(), epochs=1, verbose=0).history["loss"]


def test_integer_labels_need_the_sparse_loss() -> None:
    labels, probs = np.ones((2, 1)), np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"`target` and `output` must have the same shape"):
        keras.losses.categorical_crossentropy(labels, probs)  # Keras 2 accepted integer labels here
    np.testing.assert_allclose(keras.losses.sparse_categorical_crossentropy(labels, probs), [np.log(3)] * 2)


def test_an_uncompiled_model_has_no_optimizer() -> None:
    uncompiled = model()
    assert not hasattr(uncompiled, "optimizer")  # Keras 2: model.optimizer.lr in a reset callback
    opt = keras.optimizers.SGD(learning_rate=0.1)
    opt.learning_rate = 0.2
    assert float(keras.ops.convert_to_numpy(opt.learning_rate)) == pytest.approx(0.2)
