"""The graph op that fails with a filed error's tf.errors code and message, in Session.run and tf.function."""

from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

from unison.adapters.tensorflow import _status_op  # noqa: E402
from unison.adapters.tensorflow._bridge import _error_code  # noqa: E402
from unison.errors import AbortedError, InvalidArgumentError, MismatchError, ShutdownError  # noqa: E402

CASES = [
    (MismatchError("Mismatched shapes: [2] on rank [0]; [3] on rank [1]."), tf.errors.FailedPreconditionError),
    (AbortedError("rank 1 failed"), tf.errors.AbortedError),
    (InvalidArgumentError("root_rank must be in range(size=2). Got root_rank=7."), tf.errors.InvalidArgumentError),
    (ShutdownError("the job was shut down"), tf.errors.UnknownError),
]


@pytest.fixture(autouse=True)
def registered() -> None:
    """Register the op as the bridge does before building with it (`_bridge` calls ``available()``
    first): each test stands alone, whichever worker or order runs it."""
    assert _status_op.available()


def test_the_op_registers() -> None:
    assert _status_op.available()


@pytest.mark.parametrize(("error", "tf_error"), CASES)
def test_session_run_raises_the_code_and_message(error: Exception, tf_error: type) -> None:
    graph = tf.Graph()
    with graph.as_default():
        error_id = tf.compat.v1.placeholder(tf.int64, [])
        with tf.control_dependencies([_status_op.check(error_id, "status")]):
            out = tf.constant(1.0) + 1.0
    filed = _status_op.file_error(_error_code(error), str(error))
    with tf.compat.v1.Session(graph=graph) as session:
        assert session.run(out, {error_id: 0}) == 2.0
        with pytest.raises(tf_error, match=re.escape(str(error))):
            session.run(out, {error_id: filed})


@pytest.mark.parametrize(("error", "tf_error"), CASES)
def test_function_raises_the_code_and_message(error: Exception, tf_error: type) -> None:
    @tf.function
    def fn(error_id: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([_status_op.check(error_id, "status")]):
            return tf.identity(error_id)

    assert fn(tf.constant(0, tf.int64)).numpy() == 0
    filed = _status_op.file_error(_error_code(error), str(error))
    with pytest.raises(tf_error, match=re.escape(str(error))):
        fn(tf.constant(filed, tf.int64))


def test_an_unknown_id_is_an_unknown_error() -> None:
    @tf.function
    def fn(error_id: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([_status_op.check(error_id, "status")]):
            return tf.identity(error_id)

    with pytest.raises(tf.errors.UnknownError, match=r"collective error 987654321 was lost"):
        fn(tf.constant(987654321, tf.int64))
