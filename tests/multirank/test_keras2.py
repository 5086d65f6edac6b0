"""Keras 2 (tf_keras, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``) through unison.tensorflow.keras and unison.keras.

These cases need tf.keras to be Keras 2 from the process's first TensorFlow import, so the multi-rank
suite skips them; tests/unit/adapters/test_tf_keras_legacy.py runs this file as its own 2-rank job
with ``TF_USE_LEGACY_KERAS=1``.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
if not tf.keras.Model.__module__.startswith("tf_keras"):
    pytest.skip("Keras 2 cases: tf.keras is Keras 3 here (tests/unit/adapters/test_tf_keras_legacy.py runs "
                "them under TF_USE_LEGACY_KERAS=1)", allow_module_level=True)
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison  # noqa: E402
import unison.keras as hk  # noqa: E402
import unison.tensorflow.keras as hvd  # noqa: E402
from unison.adapters.keras.optimizer import is_distributed  # noqa: E402
from unison.errors import InvalidArgumentError  # noqa: E402

K = tf.keras
GLOBAL_BATCH = 12  # divisible by 2 and 3
FEATURES = 5


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(42)
    x = rng.randn(steps * GLOBAL_BATCH, FEATURES).astype(np.float32)
    y = (x @ rng.randn(FEATURES, 2) + 0.1 * rng.randn(steps * GLOBAL_BATCH, 2)).astype(np.float32)
    return x, y


def shard(array: np.ndarray) -> np.ndarray:
    """This rank's rows of every global batch, in order."""
    per = GLOBAL_BATCH // hvd.size()
    batches = array.reshape(-1, GLOBAL_BATCH, *array.shape[1:])
    return batches[:, hvd.rank() * per:(hvd.rank() + 1) * per].reshape(-1, *array.shape[1:])


def make_model(seed: int = 7):
    K.utils.set_random_seed(seed)  # the same initial weights on every rank
    return K.Sequential([K.Input((FEATURES,)), K.layers.Dense(4, activation="tanh"), K.layers.Dense(2)])


def assert_same_everywhere(arrays: list[np.ndarray]) -> None:
    for other in unison.allgather_object([a.tolist() for a in arrays]):
        for a, b in zip(other, arrays):
            np.testing.assert_array_equal(np.asarray(a, np.float32), b)


def assert_close(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


OPTIMIZERS = {
    "sgd": lambda: K.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: K.optimizers.Adam(0.01),
    "legacy-sgd-lr": lambda: K.optimizers.legacy.SGD(lr=0.1, momentum=0.9),  # Keras 2's `lr=` spelling
    "legacy-adam": lambda: K.optimizers.legacy.Adam(learning_rate=0.01),
}


def test_the_keras_modules_serve_keras_2() -> None:
    import tf_keras

    for module in (hvd, hk):
        assert issubclass(module.callbacks.BroadcastGlobalVariablesCallback, tf_keras.callbacks.Callback)
        assert issubclass(module.callbacks.BestModelCheckpoint, tf_keras.callbacks.ModelCheckpoint)
        assert module.load_model.__module__ == "unison.adapters.tf_keras.saving"
    assert issubclass(hvd.elastic.CommitStateCallback, tf_keras.callbacks.Callback)
    assert hk.elastic.UpdateBatchStateCallback is hvd.elastic.UpdateBatchStateCallback


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_model_fit_matches_single_process(name: str) -> None:
    x, y = data(steps=4)
    reference = make_model()
    reference.compile(optimizer=OPTIMIZERS[name](), loss="mse")
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    model = make_model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[name]())
    model.compile(optimizer=opt, loss="mse", experimental_run_tf_function=False)
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert int(opt.iterations.numpy()) == 8
    assert is_distributed(opt) and type(opt).__name__ == type(OPTIMIZERS[name]()).__name__
    assert_close(model.get_weights(), reference.get_weights())
    assert_same_everywhere(model.get_weights())


@pytest.mark.parametrize("name", ["sgd", "legacy-sgd-lr"])
def test_gradient_tape_loop_with_apply_gradients_matches_single_process(name: str) -> None:
    x, y = data(steps=3)
    reference, distributed = make_model(), make_model()
    ref_opt, opt = OPTIMIZERS[name](), hk.DistributedOptimizer(OPTIMIZERS[name]())

    def step(model, optimizer, xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    ref_step, dist_step = tf.function(step), tf.function(step)  # one per optimizer: each makes its slots
    xs, ys, per = shard(x), shard(y), GLOBAL_BATCH // hvd.size()
    for i in range(3):
        rows = slice(i * GLOBAL_BATCH, (i + 1) * GLOBAL_BATCH)
        ref_step(reference, ref_opt, x[rows], y[rows])
        dist_step(distributed, opt, xs[i * per:(i + 1) * per], ys[i * per:(i + 1) * per])
    assert_close(distributed.get_weights(), reference.get_weights())
    assert_same_everywhere(distributed.get_weights())


@pytest.mark.parametrize("name", ["sgd", "legacy-sgd-lr"])  # Adam would count the skipped steps too
@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step_two_matches_accumulated_single_process(name: str, average: bool) -> None:
    x, y = data(steps=4)
    reference = make_model()
    reference.compile(optimizer=OPTIMIZERS[name](), loss="mse")
    # one step on two global batches: the summed gradient of two means (halved when averaged)
    scale = 1.0 if average else 2.0
    reference.fit(x, y * 1.0, batch_size=2 * GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0,
                  sample_weight=np.full(len(x), scale, np.float32))
    model = make_model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[name](), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse")
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 4  # every call advances it, as Horovod's helper does
    assert_close(model.get_weights(), reference.get_weights())
    assert_same_everywhere(model.get_weights())


def test_wrapped_legacy_optimizer_keeps_lr_and_class() -> None:
    opt = hvd.DistributedOptimizer(K.optimizers.legacy.SGD(lr=0.2))
    assert isinstance(opt, K.optimizers.legacy.SGD) and type(opt).__name__ == "SGD"
    assert K.backend.get_value(opt.lr) == pytest.approx(0.2)
    K.backend.set_value(opt.lr, 0.05)  # Horovod's Keras 2 scripts change the rate this way
    assert float(K.backend.get_value(opt.learning_rate)) == pytest.approx(0.05)
    with pytest.raises(InvalidArgumentError, match="already wrapped"):
        hvd.DistributedOptimizer(opt)


def test_distributed_optimizer_names_the_kerases_it_takes() -> None:
    with pytest.raises(InvalidArgumentError, match=r"wraps a Keras optimizer: Keras 3's .* Keras 2's .* Got str"):
        hvd.DistributedOptimizer("sgd")


def test_jit_compile_is_switched_off_with_one_warning() -> None:
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    assert [str(w.message) for w in caught if "jit_compile" in str(w.message)] == [
        "unison: the model was compiled with jit_compile=True, but the gradient allreduce cannot run inside an "
        "XLA-compiled step; switching this model to jit_compile=False. Pass jit_compile=False to "
        "model.compile() to silence this warning."]
    x, y = data(steps=1)
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, verbose=0)
    assert not model.jit_compile


def fit_least_squares(compression, steps: int):
    rng = np.random.RandomState(7)
    x = rng.randn(48, 16).astype(np.float32)
    y = (x @ rng.randn(16, 1) + 0.1 * rng.randn(48, 1)).astype(np.float32)
    optimum = np.linalg.lstsq(x.astype(np.float64), y.astype(np.float64), rcond=None)[0]
    model = K.Sequential([K.Input((16,)), K.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = hvd.DistributedOptimizer(K.optimizers.SGD(0.05), compression=compression)
    model.compile(optimizer=opt, loss="mse")
    per = 48 // hvd.size()
    xs, ys = x[hvd.rank() * per:(hvd.rank() + 1) * per], y[hvd.rank() * per:(hvd.rank() + 1) * per]
    model.fit(np.tile(xs, (steps, 1)), np.tile(ys, (steps, 1)), batch_size=per, epochs=1, shuffle=False,
              verbose=0)
    w = model.get_weights()[0]
    spread = np.abs(np.asarray(unison.allgather_object(w.ravel().tolist())) - w.ravel()).max()
    return w, optimum, float(spread), opt.statistics()


def test_compression_schemes_train_as_under_keras3() -> None:
    w, optimum, spread, _ = fit_least_squares(hvd.Compression.fp16, steps=300)
    reference, _, _, _ = fit_least_squares(hvd.Compression.none, steps=300)
    assert spread == 0.0 and np.abs(w - reference).max() < 1e-2
    w, optimum, spread, stats = fit_least_squares(hvd.Compression.topk(0.125), steps=600)
    assert spread == 0.0 and np.abs(w - optimum).max() < 0.05  # from an initial distance of 1.8
    assert stats["dense_bytes"] == 600 * 16 * 4 and 0 < stats["payload_bytes"] < stats["dense_bytes"]
    w, optimum, spread, stats = fit_least_squares(hvd.Compression.partial(0.25), steps=600)
    assert 0.0 < spread < 0.05 and np.abs(w - optimum).max() < 0.05
    assert stats["payload_bytes"] * 4 == stats["dense_bytes"] == 600 * 16 * 4


# -- callbacks ---------------------------------------------------------------------------------------


class Recorder(K.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.lrs: list[float] = []
        self.momentums: list[float] = []
        self.epoch_logs: list[dict] = []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.lrs.append(float(K.backend.get_value(opt.lr)))
        if isinstance(opt, K.optimizers.legacy.SGD):
            self.momentums.append(float(K.backend.get_value(opt.momentum)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def xy(rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(hvd.rank())
    return rng.randn(rows, FEATURES).astype(np.float32), rng.randn(rows, 2).astype(np.float32)


def test_broadcast_callback_makes_every_rank_start_from_the_root() -> None:
    model = make_model(seed=100 + hvd.rank())
    root_weights = [w.numpy() for w in model.weights] if hvd.rank() == 0 else None
    root_weights = unison.broadcast_object(root_weights, 0)
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.0)), loss="mse")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(*xy(), batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    assert callback.broadcasts == 2 and callback.broadcast_done  # before the first batch, and after it
    assert_close(model.get_weights(), root_weights)


def test_metric_average_callback_averages_logs() -> None:
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.0)), loss="mse")
    raw, averaged = Recorder(), Recorder()
    model.fit(*xy(), batch_size=4, epochs=1, verbose=0,
              callbacks=[raw, hvd.callbacks.MetricAverageCallback(), averaged])
    losses = unison.allgather_object(raw.epoch_logs[0]["loss"])
    assert len(set(losses)) == hvd.size()
    assert averaged.epoch_logs[0]["loss"] == pytest.approx(float(np.mean(losses)), rel=1e-6)


@pytest.mark.parametrize("name", ["sgd", "legacy-sgd-lr"])
def test_warmup_callback_values_and_lr_log(name: str) -> None:
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS[name]()), loss="mse")
    recorder = Recorder()
    model.fit(*xy(rows=8), batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2), recorder])
    size = hvd.size()
    expected = [0.1 / size * ((e + b / 2 + 0.5) * (size - 1) / 2 + 1) for e in range(2) for b in range(2)]
    assert recorder.lrs[:4] == pytest.approx(expected, rel=1e-6)
    assert recorder.lrs[4:] == pytest.approx([recorder.lrs[3]] * 2, rel=1e-6)  # held after the warmup
    assert recorder.epoch_logs[1]["lr"] == pytest.approx(0.1, rel=1e-6)  # Horovod's Keras 2 log key


def test_schedule_callback_corrects_a_legacy_momentum_for_the_batch_that_changes_the_rate() -> None:
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.legacy.SGD(lr=0.1, momentum=0.9)),
                  loss="mse")
    recorder = Recorder()
    model.fit(*xy(rows=8), batch_size=4, epochs=2, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch),
        recorder])
    assert recorder.lrs == pytest.approx([0.1, 0.1, 0.05, 0.05])
    # scaled by new/old rate on the first batch of each epoch (1 then 0.5), as Horovod does, restored after
    assert recorder.momentums == pytest.approx([0.9, 0.9, 0.45, 0.9])


def test_schedule_callback_refuses_schedule_objects() -> None:
    schedule = K.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(schedule)), loss="mse")
    with pytest.raises(ValueError, match=r"uses a LearningRateSchedule \(ExponentialDecay\)"):
        model.fit(*xy(), batch_size=4, epochs=1, verbose=0, callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5)])


def test_best_model_checkpoint_saves_on_rank_0_only(tmp_path) -> None:
    path = str(tmp_path / "best.h5")
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.01)), loss="mse")
    model.fit(*xy(), batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)])
    assert os.path.exists(path) == (hvd.rank() == 0)
    with pytest.raises(InvalidArgumentError, match="BestModelCheckpoint needs a file path"):
        model.fit(*xy(), epochs=1, verbose=0, callbacks=[hk.callbacks.BestModelCheckpoint("loss", 0, "min")])


@pytest.mark.parametrize("suffix", [".h5", ".keras"])
def test_save_and_load_with_wrapped_optimizer(tmp_path, suffix: str) -> None:
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.Adam(0.01)), loss="mse")
    model.fit(*xy(), batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / f"model{suffix}")
    model.save(path)
    plain = K.models.load_model(path)
    assert type(plain.optimizer).__name__ == "Adam" and not is_distributed(plain.optimizer)
    again = hvd.load_model(path)
    assert is_distributed(again.optimizer) and isinstance(again.optimizer, K.optimizers.Adam)
    assert int(again.optimizer.iterations.numpy()) == 2
    assert_close(again.get_weights(), model.get_weights())
    again.fit(*xy(), batch_size=4, epochs=1, verbose=0)  # the reloaded model keeps training distributed
    assert again.optimizer.statistics()["apply_calls"] >= 1
    assert_same_everywhere(again.get_weights())


def test_partial_distributed_optimizer_keeps_local_layer_gradients_local() -> None:
    model = make_model()
    opt = hvd.PartialDistributedOptimizer(K.optimizers.SGD(0.1), local_layers=[model.layers[-1]])
    model.compile(optimizer=opt, loss="mse")
    model.fit(*xy(), batch_size=8, epochs=1, verbose=0)  # each rank its own data
    gathered = unison.allgather_object([w.tolist() for w in model.get_weights()])
    first, last = [np.asarray(g[0]) for g in gathered], [np.asarray(g[2]) for g in gathered]
    assert all(np.array_equal(first[0], f) for f in first)  # reduced: the same everywhere
    assert not np.array_equal(last[0], last[1])  # local: each rank's own


@pytest.mark.parametrize("legacy", [True, False])
def test_compute_gradients_returns_them_reduced_and_apply_gradients_does_not_reduce_them_again(legacy: bool) -> None:
    # Horovod's wrapper reduces in _compute_gradients (which a legacy optimizer's minimize and fit call)
    # and compute_gradients; with op=Sum a second reduction in apply_gradients would multiply by the size.
    x = tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(K.optimizers.legacy.SGD(1.0) if legacy else K.optimizers.SGD(1.0), op=hvd.Sum)

    def loss() -> tf.Tensor:
        return tf.reduce_sum(x * float(hvd.rank() + 1))

    pairs = opt._compute_gradients(loss, [x]) if legacy else opt.compute_gradients(loss, [x])
    total = float(sum(r + 1 for r in range(hvd.size())))
    np.testing.assert_allclose(pairs[0][0].numpy(), [total])
    opt.apply_gradients(pairs)
    np.testing.assert_allclose(x.numpy(), [-total])


def test_aggregation_state_reads_as_horovods_agg_helper_and_local_variables_go_by_identity() -> None:
    assert hvd.DistributedOptimizer(K.optimizers.legacy.SGD(1.0))._agg_helper is None  # one pass per step
    local, shared = tf.Variable([0.0]), tf.Variable([0.0])  # both named "Variable:0"
    opt = hvd.DistributedOptimizer(K.optimizers.legacy.SGD(1.0), backward_passes_per_step=2)
    opt.register_local_var(local)
    counters = []
    for _ in range(3):
        pairs = opt._compute_gradients(lambda: tf.reduce_sum((local + shared) * float(hvd.rank() + 1)),
                                       [local, shared])
        opt.apply_gradients(pairs)
        counters.append(int(opt._agg_helper.counter.numpy()))
    assert counters == [1, 0, 1]  # the passes summed since the last update, as Horovod's helper counts
    # one update, of the two passes' sum: the local variable's own (divided by the size), the other averaged
    np.testing.assert_allclose(local.numpy(), [-2.0 * (hvd.rank() + 1) / hvd.size()], rtol=1e-6)
    np.testing.assert_allclose(shared.numpy(), [-2.0 * np.mean(np.arange(1, hvd.size() + 1))], rtol=1e-6)


def test_sync_batch_normalization_is_a_keras2_layer_with_the_global_batchs_statistics() -> None:
    import unison.tensorflow as htf

    assert issubclass(htf.SyncBatchNormalization, K.layers.BatchNormalization)
    size, rank = hvd.size(), hvd.rank()
    everything = np.random.RandomState(3).randn(4 * size, 3).astype(np.float32)
    mine = everything[4 * rank:4 * (rank + 1)]
    sync, plain = htf.SyncBatchNormalization(), K.layers.BatchNormalization()
    out, reference = sync(mine, training=True), plain(everything, training=True)
    np.testing.assert_allclose(out.numpy(), reference.numpy()[4 * rank:4 * (rank + 1)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sync.moving_variance.numpy(), plain.moving_variance.numpy(), rtol=1e-5)
    model = K.Sequential([K.Input((3,)), htf.SyncBatchNormalization(), K.layers.Dense(1)])  # a tf_keras model
    model.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.1)), loss="mse")
    model.fit(mine, mine[:, :1], batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_everywhere(model.get_weights())


# -- elastic -----------------------------------------------------------------------------------------


def optimizer_variables(model) -> list:
    variables = model.optimizer.variables  # a method of Keras 2's legacy optimizers, a list otherwise
    return list(variables() if callable(variables) else variables)


@pytest.mark.parametrize("name", ["adam", "legacy-sgd-lr"])
def test_elastic_state_and_callbacks_under_fit(name: str) -> None:
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS[name]()), loss="mse")
    x, y = data(steps=2)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    original_commit = state.commit
    state.commit = lambda: (commits.append((state.epoch, state.batch)), original_commit())[1]
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=2, shuffle=False, verbose=0,
              callbacks=callbacks)
    assert state.epoch == 2 and state.batch == 0
    assert commits == [(0, 1), (1, 0), (1, 1), (2, 0)]  # every 2 batches and at each epoch's end
    weights, slots = model.get_weights(), [v.numpy() for v in optimizer_variables(model)]
    assert len(slots) >= 3
    model.set_weights([np.zeros_like(w) for w in weights])
    for v in optimizer_variables(model):
        v.assign(tf.zeros_like(v))
    state.restore()  # back to the last commit: the weights and every optimizer variable
    assert_close(model.get_weights(), weights)
    assert_close([v.numpy() for v in optimizer_variables(model)], slots)
    assert_same_everywhere(model.get_weights())
