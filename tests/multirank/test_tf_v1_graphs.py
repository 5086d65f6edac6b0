"""TensorFlow 1 graphs run by a session, as Horovod's TensorFlow module serves them: broadcast of the
graph's global variables and DistributedOptimizer around ``tf.compat.v1.train`` optimizers."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

import unison.tensorflow as hvd  # noqa: E402
from unison.errors import UnisonNotImplementedError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_broadcast_global_variables_gives_every_variable_the_roots_value() -> None:
    root = hvd.size() - 1
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.Variable(tf.fill([3], float(hvd.rank())), name="a")
        b = tf.compat.v1.Variable([[hvd.rank(), 1]], name="b")
        sync = hvd.broadcast_global_variables(root)
        assert isinstance(sync, tf.Operation)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(sync)
            got_a, got_b = session.run([a, b])
    np.testing.assert_array_equal(got_a, [float(root)] * 3)
    np.testing.assert_array_equal(got_b, [[root, 1]])


def test_broadcast_global_variables_refuses_eager_execution() -> None:
    with pytest.raises(RuntimeError, match=r"does not support eager execution. Please use "
                                           r"`hvd.broadcast_variables"):
        hvd.broadcast_global_variables(0)


def _minimize(op: object = hvd.Average, local: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One step of plain gradient descent (rate 1) on w·(rank+1) + v·(rank+1); returns w and v."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable([0.0], name="w")
        v = tf.compat.v1.Variable([0.0], name="v")
        loss = tf.reduce_sum((w + v) * float(hvd.rank() + 1))
        plain = tf.compat.v1.train.GradientDescentOptimizer(1.0)
        opt = hvd.DistributedOptimizer(plain, op=op)
        assert isinstance(opt, tf.compat.v1.train.Optimizer) and opt._optimizer is plain
        if local:
            opt.register_local_var(v)
        step = opt.minimize(loss)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step)
            return session.run([w, v])


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_a_tf1_optimizer_steps_with_the_reduced_gradient(op: str) -> None:
    size = hvd.size()
    total = float(sum(r + 1 for r in range(size)))
    w, v = _minimize(op=getattr(hvd, op))
    want = -total / size if op == "Average" else -total
    np.testing.assert_allclose([w[0], v[0]], [want, want], rtol=1e-6)


def test_a_tf1_optimizers_local_variable_keeps_its_own_gradient_divided_by_the_size() -> None:
    size = hvd.size()
    w, v = _minimize(local=True)
    np.testing.assert_allclose(w, [-float(sum(r + 1 for r in range(size))) / size], rtol=1e-6)
    np.testing.assert_allclose(v, [-float(hvd.rank() + 1) / size], rtol=1e-6)  # scale_local_gradients


def test_a_tf1_optimizer_refuses_backward_passes_with_the_reason() -> None:
    with pytest.raises(UnisonNotImplementedError, match=r"backward_passes_per_step > 1 is not supported for "
                                                        r"tf.compat.v1.train optimizers. Got "
                                                        r"backward_passes_per_step=2; wrap a Keras optimizer"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2)
