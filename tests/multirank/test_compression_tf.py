"""Gradient compression in DistributedGradientTape and the Keras DistributedOptimizer (TensorFlow
backend) across real processes: cast precision, exact payload bytes, sparsified and partially
synchronized training reaching the least-squares optimum, and digits accuracy."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)

import unison.keras as hk  # noqa: E402
import unison.tensorflow as hvd  # noqa: E402

DIM = 16
ROWS = 48


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def least_squares() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.RandomState(7)
    x = rng.randn(ROWS, DIM).astype(np.float32)
    y = (x @ rng.randn(DIM, 1) + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
    optimum = np.linalg.lstsq(x.astype(np.float64), y.astype(np.float64), rcond=None)[0]
    return x, y, optimum


def shard(a: np.ndarray) -> np.ndarray:
    per = a.shape[0] // hvd.size()
    return a[hvd.rank() * per : (hvd.rank() + 1) * per]


def spread_of(w: np.ndarray) -> float:
    everywhere = np.asarray(hvd.allgather_object(np.asarray(w).reshape(-1).tolist()))
    return float(np.abs(everywhere - everywhere[0]).max())


def test_tape_fp16_and_bf16_stay_within_their_precision() -> None:
    base = tf.linspace(-3.0, 3.0, 1000) * float(1 + hvd.rank())
    results = {}
    for name, compression in [("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                              ("bf16", hvd.Compression.bf16)]:
        v = tf.Variable(tf.zeros(1000))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * base)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        (grad,) = tape.gradient(loss, [v])
        assert grad.dtype == tf.float32
        results[name] = grad.numpy()
    want = results["none"]
    for name, bits in [("fp16", 11), ("bf16", 8)]:
        error = np.abs(results[name] - want)
        assert np.all(error <= 2.0 ** (1 - bits) * np.abs(want) + 1e-6), (name, error.max())
        assert error.max() > 0, f"{name} sent uncompressed gradients"


@pytest.mark.convergence
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "function"])
def test_tape_topk_reaches_the_optimum_and_sends_k_pairs(compiled: bool) -> None:
    x, y, optimum = least_squares()
    xs, ys = tf.constant(shard(x)), tf.constant(shard(y))
    w = tf.Variable(tf.zeros((DIM, 1)))
    compression = hvd.Compression.topk(0.125)

    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(xs @ w - ys))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.05 * grad)

    run = tf.function(step) if compiled else step
    for _ in range(1000):
        run()
    assert compression.statistics()["payload_bytes"] == 1000 * math.ceil(0.125 * DIM) * 8
    assert spread_of(w.numpy()) == 0.0
    assert np.abs(w.numpy() - optimum).max() < 1e-2  # from an initial distance of 1.8


@pytest.mark.convergence
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "function"])
def test_tape_powersgd_reaches_the_optimum_with_low_rank_factors(compiled: bool) -> None:
    outputs = 8
    rng = np.random.RandomState(5)
    x = rng.randn(ROWS, DIM).astype(np.float32)
    y = (x @ rng.randn(DIM, outputs) + 0.1 * rng.randn(ROWS, outputs)).astype(np.float32)
    optimum = np.linalg.lstsq(x.astype(np.float64), y.astype(np.float64), rcond=None)[0]
    xs, ys = tf.constant(shard(x)), tf.constant(shard(y))
    w = tf.Variable(tf.zeros((DIM, outputs)))  # 16 x 8: rank-1 factors carry 24 of 128 values
    compression = hvd.Compression.powersgd(1)

    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(xs @ w - ys)) / float(xs.shape[0])
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.05 * grad)

    run = tf.function(step) if compiled else step
    for _ in range(500):
        run()
    assert compression.statistics()["payload_bytes"] == 500 * (DIM + outputs) * 4
    assert spread_of(w.numpy()) == 0.0
    assert np.abs(w.numpy() - optimum).max() < 1e-3


def fit_least_squares(compression, steps: int):
    x, y, optimum = least_squares()
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1, use_bias=False,
                                                                      kernel_initializer="zeros")])
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=compression)
    model.compile(optimizer=opt, loss="mse")
    # one epoch of `steps` full-shard batches: Keras's per-epoch overhead would dominate otherwise
    xs, ys = np.tile(shard(x), (steps, 1)), np.tile(shard(y), (steps, 1))
    model.fit(xs, ys, batch_size=ROWS // hvd.size(), epochs=1, shuffle=False, verbose=0)
    return model.get_weights()[0], optimum, opt


@pytest.mark.convergence
@pytest.mark.parametrize("make", [lambda: hvd.Compression.topk(0.125), lambda: hvd.Compression.threshold(0.05)],
                         ids=["topk", "threshold"])
def test_keras_fit_sparsified_reaches_the_optimum(make) -> None:
    # 300 steps: 0.002 away (topk) and 0.001 (threshold), as after 1000
    w, optimum, opt = fit_least_squares(make(), steps=300)
    assert spread_of(w) == 0.0
    assert np.abs(w - optimum).max() < 1e-2  # from an initial distance of 1.8
    stats = opt.statistics()
    assert stats["dense_bytes"] == 300 * DIM * 4
    assert 0 < stats["payload_bytes"] < stats["dense_bytes"]


@pytest.mark.convergence
def test_keras_fit_partial_synchronization_stays_close_and_converges() -> None:
    w, optimum, opt = fit_least_squares(hvd.Compression.partial(0.25), steps=300)  # 0.004 away, as after 600
    assert 0.0 < spread_of(w) < 0.05
    assert np.abs(w - optimum).max() < 0.02
    stats = opt.statistics()
    assert stats["payload_bytes"] * 4 == stats["dense_bytes"] == 300 * DIM * 4


def digits_accuracy(compression) -> float:
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = (data.data / 16.0).astype(np.float32), data.target
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    per = 1500 // hvd.size() // 25 * 25
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                    compression=compression),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[hvd.rank() * per : (hvd.rank() + 1) * per], y[hvd.rank() * per : (hvd.rank() + 1) * per],
              batch_size=25, epochs=15, shuffle=False, verbose=0)
    return float(np.mean(model.predict(x[1500:], verbose=0).argmax(1) == y[1500:]))


@pytest.mark.convergence
def test_keras_digits_accuracy_per_scheme() -> None:
    base = digits_accuracy(hvd.Compression.none)
    assert base > 0.95
    assert digits_accuracy(hvd.Compression.fp16) >= base - 0.01
    assert digits_accuracy(hvd.Compression.topk(0.01)) >= base - 0.03
    assert digits_accuracy(hvd.Compression.powersgd(2)) >= base - 0.03
