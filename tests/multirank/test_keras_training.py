"""Training on N ranks with each holding 1/N of the batch gives one process's weights on the whole batch."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison.keras as hk  # noqa: E402
import unison.tensorflow as hvd  # noqa: E402
from unison.adapters.keras.optimizer import is_distributed  # noqa: E402

GLOBAL_BATCH = 12  # divisible by 2 and 3
FEATURES = 5
LR = 0.1


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


def make_model() -> keras.Model:
    keras.utils.set_random_seed(7)  # the same initial weights on every rank
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def assert_same_everywhere(weights: list[np.ndarray]) -> None:
    gathered = hvd.allgather_object([w.tolist() for w in weights])
    for other in gathered:
        for a, b in zip(other, weights):
            np.testing.assert_array_equal(np.asarray(a, np.float32), b)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "function"])
def test_gradient_tape_loop_matches_single_process(compiled: bool) -> None:
    x, y = data(steps=3)
    reference, distributed = make_model(), make_model()
    ref_opt, opt = keras.optimizers.SGD(LR), keras.optimizers.SGD(LR)

    def step(model, optimizer, xb, yb, wrap):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        if wrap:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    dist_step = tf.function(step) if compiled else step
    xs, ys = shard(x), shard(y)
    per = GLOBAL_BATCH // hvd.size()
    for i in range(3):
        step(reference, ref_opt, x[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH],
             y[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH], False)
        dist_step(distributed, opt, xs[i * per:(i + 1) * per], ys[i * per:(i + 1) * per], True)
    for a, b in zip(reference.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert_same_everywhere(distributed.get_weights())


def test_model_fit_matches_single_process() -> None:
    x, y = data(steps=4)
    reference = make_model()
    reference.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    model = make_model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR))
    model.compile(optimizer=opt, loss="mse")
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=2, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 8
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert_same_everywhere(model.get_weights())


@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step_two_matches_accumulated_single_process(average: bool) -> None:
    x, y = data(steps=4)  # 2 updates of 2 micro-batches each
    reference = make_model()
    ref_opt = keras.optimizers.SGD(LR)
    for update in range(2):
        total = None
        for micro in range(2):
            rows = slice((2 * update + micro) * GLOBAL_BATCH, (2 * update + micro + 1) * GLOBAL_BATCH)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(reference(x[rows]) - y[rows]))
            grads = tape.gradient(loss, reference.trainable_variables)
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        if average:
            total = [t / 2 for t in total]
        ref_opt.apply_gradients(zip(total, reference.trainable_variables))

    model = make_model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                  average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse")
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 4
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert_same_everywhere(model.get_weights())


def test_jit_compile_is_switched_off_with_one_warning() -> None:
    x, y = data(steps=2)
    model = make_model()
    with pytest.warns(UserWarning, match=r"switching this model to jit_compile=False"):
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse",
                      jit_compile=True)
    model.fit(shard(x), shard(y), batch_size=GLOBAL_BATCH // hvd.size(), epochs=1, verbose=0)
    assert model.jit_compile is False
    assert_same_everywhere(model.get_weights())


def test_xla_function_refuses_clearly() -> None:
    model = make_model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR))
    opt.build(model.trainable_variables)

    @tf.function(jit_compile=True)
    def step(xb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(xb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    # TensorFlow re-raises errors from tracing as its own StagingError; the message is ours.
    with pytest.raises(Exception, match=r"cannot apply gradients inside an XLA-compiled function"):
        step(tf.ones([2, FEATURES]))


def test_wrapper_keeps_instance_schedule_and_class_name() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)
    base = keras.optimizers.Adam(learning_rate=schedule)
    wrapped = hk.DistributedOptimizer(base)
    assert wrapped is base and is_distributed(wrapped) and isinstance(wrapped, keras.optimizers.Adam)
    assert type(wrapped).__name__ == "Adam" and wrapped._learning_rate is schedule
    with pytest.raises(ValueError, match=r"already wrapped"):
        hk.DistributedOptimizer(wrapped)
    with pytest.raises(ValueError, match=r"op currently only supports Average and Sum"):
        hk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)


def test_partial_distributed_optimizer_keeps_local_layer_gradients_local() -> None:
    model = make_model()
    local_layer = model.layers[-1]
    opt = hk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local_layer])
    opt.build(model.trainable_variables)
    grads = [tf.fill(v.shape, float(hvd.rank() + 1)) for v in model.trainable_variables]
    before = [v.numpy().copy() for v in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    mean = sum(range(1, hvd.size() + 1)) / hvd.size()
    for v, b in zip(model.trainable_variables[:2], before[:2]):
        np.testing.assert_allclose(b - v.numpy(), mean, rtol=1e-6)
    for v, b in zip(model.trainable_variables[2:], before[2:]):
        np.testing.assert_allclose(b - v.numpy(), (hvd.rank() + 1) / hvd.size(), rtol=1e-6)
