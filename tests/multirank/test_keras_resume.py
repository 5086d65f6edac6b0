"""Horovod's Keras resume recipe: rank 0 loads the checkpoint, the others build a fresh model, the callback syncs them.

Written against ``tf.keras`` and ``unison.tensorflow.keras``, so the same cases run with Keras 3 (the
multi-rank suite) and with Keras 2 (tests/unit/adapters/test_tf_keras_legacy.py runs this file under
``TF_USE_LEGACY_KERAS=1``). The stall bounds are lowered for this module, so a rank that broadcasts
other variables than the root fails in seconds instead of waiting for the 600 s shutdown.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison  # noqa: E402
import unison.tensorflow.keras as hvd  # noqa: E402
from unison.adapters.keras.optimizer import is_distributed  # noqa: E402

K = tf.keras
KERAS2 = K.Model.__module__.startswith("tf_keras")  # TF_USE_LEGACY_KERAS=1 with tf-keras
GLOBAL_BATCH = 12  # divisible by 2, 3 and 4
STALL = {"UNISON_STALL_CHECK_TIME_SECONDS": "2", "UNISON_STALL_SHUTDOWN_TIME_SECONDS": "20"}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def job():
    saved = {name: os.environ.get(name) for name in STALL}
    os.environ.update(STALL)
    try:
        hvd.init()
        try:
            yield
        finally:
            hvd.shutdown()
    finally:  # the later modules of this pytest process keep their own bounds
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(5)
    x = rng.randn(steps * GLOBAL_BATCH, 3).astype(np.float32)
    return x, (x @ rng.randn(3, 2)).astype(np.float32)


def shard(array: np.ndarray) -> np.ndarray:
    per = GLOBAL_BATCH // hvd.size()
    batches = array.reshape(-1, GLOBAL_BATCH, *array.shape[1:])
    return batches[:, hvd.rank() * per:(hvd.rank() + 1) * per].reshape(-1, *array.shape[1:])


def optimizer(kind: str):
    return K.optimizers.legacy.Adam(0.05) if kind == "legacy" else K.optimizers.Adam(0.05)


def fresh_model(kind: str, seed: int, input_shape: bool = True, distributed: bool = True):
    """The model every rank builds; names restart so a fresh model's match a loaded one's."""
    K.backend.clear_session()
    K.utils.set_random_seed(seed)
    layers = [K.layers.Dense(4, activation="tanh"), K.layers.Dense(2)]
    model = K.Sequential(([K.Input((3,))] if input_shape else []) + layers)
    opt = hvd.DistributedOptimizer(optimizer(kind)) if distributed else optimizer(kind)
    # a loss object: Keras 3 cannot read the loss "mse" back from an .h5 file
    model.compile(optimizer=opt, loss=K.losses.MeanSquaredError())
    return model


def one_process_model(kind: str, weights: list[np.ndarray], slots: list[np.ndarray]):
    """A plain model in the state the checkpoint was saved in, set from memory (no loader involved)."""
    model = fresh_model(kind, seed=0, distributed=False)
    model.set_weights(weights)
    opt = model.optimizer
    (opt._create_all_weights if hasattr(opt, "_create_all_weights") else opt.build)(model.trainable_variables)
    opt.set_weights(slots)
    return model


def numpy(values) -> list[np.ndarray]:
    return [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in values]


def optimizer_values(model) -> list[np.ndarray]:
    variables = model.optimizer.variables
    return numpy(variables() if callable(variables) else variables)


def assert_same_everywhere(arrays: list[np.ndarray]) -> None:
    for other in unison.allgather_object([a.tolist() for a in arrays]):
        assert len(other) == len(arrays)
        for a, b in zip(other, arrays):
            np.testing.assert_array_equal(np.asarray(a, b.dtype), b)


def checkpoint(tmp_path, kind: str, suffix: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    """A checkpoint of a first job (every rank trains one epoch, rank 0 saves), and the state it holds."""
    path = unison.broadcast_object(str(tmp_path / f"checkpoint{suffix}"), 0)
    x, y = data(steps=2)
    model = fresh_model(kind, seed=1)
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    if hvd.rank() == 0:
        model.save(path)
    unison.barrier()
    return path, numpy(model.get_weights()), optimizer_values(model)


def restores_optimizer(kind: str, suffix: str) -> bool:
    """Whether the file keeps the optimizer's state: tf_keras (Keras 2) restores none from a SavedModel
    directory, and a legacy optimizer's only from .h5 (a process that loads those starts the
    optimizer afresh, with or without unison)."""
    return not KERAS2 or (suffix == ".h5" or (suffix == ".keras" and kind != "legacy"))


CASES = [("adam", ".keras"), ("adam", ".h5")]
if KERAS2:
    CASES += [("legacy", ".keras"), ("legacy", ".h5"), ("adam", "")]  # "": a SavedModel directory


@pytest.mark.parametrize("kind,suffix", CASES, ids=[f"{k}{s or '-savedmodel'}" for k, s in CASES])
def test_rank_0_loads_the_others_start_fresh_and_training_goes_on_as_one_process(tmp_path, kind: str,
                                                                                 suffix: str) -> None:
    path, saved_weights, saved_slots = checkpoint(tmp_path, kind, suffix)
    x, y = data(steps=3)
    if hvd.rank() == 0:
        K.backend.clear_session()
        model = hvd.load_model(path)
        assert is_distributed(model.optimizer)
    else:
        model = fresh_model(kind, seed=100 + hvd.rank())  # other weights, an optimizer not built yet
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights, slots = numpy(model.get_weights()), optimizer_values(model)
    assert_same_everywhere(weights)
    assert_same_everywhere(slots)
    if hvd.rank() == 0:  # one process that goes on from the checkpoint over the whole batch
        if restores_optimizer(kind, suffix):
            reference = one_process_model(kind, saved_weights, saved_slots)
        else:
            K.backend.clear_session()
            reference = K.models.load_model(path)
        reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        for a, b in zip(numpy(reference.get_weights()), weights):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        for a, b in zip(optimizer_values(reference), slots):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.min_ranks(2)  # at one rank there is only the loaded model
def test_fresh_models_without_an_input_shape_are_synced_after_the_first_batch(tmp_path) -> None:
    """Before the first batch a fresh model without an input shape has no variables yet, the loaded one
    has: the ranks skip the early broadcast together and sync everything after the first batch."""
    path, _, _ = checkpoint(tmp_path, "adam", ".keras")
    x, y = data(steps=3)
    if hvd.rank() == 0:
        K.backend.clear_session()
        model = hvd.load_model(path)
    else:
        model = fresh_model("adam", seed=100 + hvd.rank(), input_shape=False)
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, shuffle=False, verbose=0,
              callbacks=[callback])
    assert callback.broadcasts == 1 and callback.broadcast_done
    assert_same_everywhere(numpy(model.get_weights()))
    assert_same_everywhere(optimizer_values(model))


def test_fit_starts_at_a_broadcast_epoch() -> None:
    """``initial_epoch=hvd.broadcast(resume_from_epoch, 0)``, as Horovod's Keras examples resume (they
    feed a dataset or a generator: tf_keras's fit cannot repeat NumPy arrays a tensor's number of times)."""
    resume_from_epoch = hvd.broadcast(2 if hvd.rank() == 0 else 0, 0)
    assert resume_from_epoch.shape == () and int(resume_from_epoch) == 2
    x, y = data(steps=1)
    dataset = tf.data.Dataset.from_tensor_slices((shard(x), shard(y))).batch(GLOBAL_BATCH // hvd.size())
    model = fresh_model("adam", seed=1)
    history = model.fit(dataset, epochs=3, initial_epoch=resume_from_epoch, verbose=0)
    assert history.epoch == [2]
