"""TensorFlow GPU tensors: eager collectives run on the GPU data plane through DLPack; the host fallbacks stay exact."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

if not tf.config.list_physical_devices("GPU"):
    pytest.skip("TensorFlow sees no GPU (tensorflow-cpu is installed, or CUDA_VISIBLE_DEVICES hides it): "
                "pip install 'tensorflow[and-cuda]' for these tests", allow_module_level=True)

import unison.tensorflow as hvd  # noqa: E402
from unison.adapters.tensorflow import _gpu  # noqa: E402
from unison.gpu import handoff  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def on_gpu(values: np.ndarray) -> tf.Tensor:
    with tf.device("/GPU:0"):
        return tf.identity(tf.constant(values))


def test_a_gpu_tensor_takes_the_device_route() -> None:
    x = on_gpu(np.ones(4, np.float32))
    assert _gpu.route_for([x], device_path=True, op_name="HorovodAllreduce") == _gpu.Route("cuda")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "uint8"])
def test_eager_allreduce_runs_on_the_plane_and_returns_a_gpu_tensor(dtype: str) -> None:
    x = on_gpu(np.arange(12).reshape(3, 4).astype(dtype))
    out = hvd.allreduce(x, op=hvd.Sum, name=f"tf.gpu.sum.{dtype}")
    assert "GPU" in out.device and out.dtype == x.dtype and out.shape == x.shape
    np.testing.assert_array_equal(out.numpy(), np.arange(12).reshape(3, 4).astype(dtype))
    assert handoff.bound_ordinal() == 0  # the plane's device was made for this GPU


def test_the_collective_reads_a_producer_queued_just_before_it() -> None:
    big = on_gpu(np.full((2048, 2048), 1.0 / 2048, np.float32))
    produced = big
    for _ in range(20):  # queued on TensorFlow's stream, still running when the collective is asked for
        produced = tf.matmul(produced, big)  # each product is 1/2048 everywhere again, in fresh memory
    out = hvd.allreduce(produced, op=hvd.Sum, name="tf.gpu.producer")
    consumed = out * 2048.0 + 1.0  # TensorFlow's kernel reads the result
    np.testing.assert_allclose(consumed.numpy(), np.full((2048, 2048), 2.0, np.float32), rtol=1e-5)


def test_allgather_broadcast_reducescatter_and_a_group_on_the_gpu() -> None:
    x = on_gpu(np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(hvd.allgather(x, name="tf.gpu.gather").numpy(), x.numpy())
    np.testing.assert_array_equal(hvd.broadcast(x, 0, name="tf.gpu.bcast").numpy(), x.numpy())
    np.testing.assert_array_equal(hvd.reducescatter(x, op=hvd.Sum, name="tf.gpu.rs").numpy(), x.numpy())
    a, b = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name="tf.gpu.group")
    assert "GPU" in a.device and "GPU" in b.device
    np.testing.assert_array_equal(b.numpy(), 2 * x.numpy())


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.int32])
def test_host_fallback_dtypes_stay_exact(dtype: tf.DType) -> None:
    x = tf.cast(on_gpu(np.arange(8, dtype=np.float32)), dtype)
    assert _gpu.route_for([x], device_path=True, op_name="HorovodAllreduce").device == "cpu"
    out = hvd.allreduce(x, op=hvd.Sum, name=f"tf.gpu.host.{dtype.name}")
    np.testing.assert_array_equal(tf.cast(out, tf.float32).numpy(), np.arange(8, dtype=np.float32))


def test_inside_tf_function_the_result_is_the_same() -> None:
    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(x, op=hvd.Sum, name="tf.gpu.fn") * 3.0

    x = on_gpu(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(step(x).numpy(), 3 * np.arange(5, dtype=np.float32))


def test_gradient_tape_gradients_reduce_on_the_gpu() -> None:
    with tf.device("/GPU:0"):
        w = tf.Variable(tf.ones([4, 1]))
        data = tf.random.stateless_normal([16, 4], seed=(1, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.matmul(data, w) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    (grad,) = tape.gradient(loss, [w])
    with tf.GradientTape() as plain:
        plain_loss = tf.reduce_mean(tf.matmul(data, w) ** 2)
    expected = plain.gradient(plain_loss, [w])[0]
    assert "GPU" in grad.device
    np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-6)
