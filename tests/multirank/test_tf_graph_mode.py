"""TensorFlow graph mode (tf.compat.v1 graphs run by Session.run, and tf.function): errors, op order, gradient names."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

import unison.tensorflow as hvd  # noqa: E402
from unison.errors import MismatchError  # noqa: E402

COUNT = 30  # independent collectives in one graph: far more than the inter-op threads of a small machine
DEADLINE_SECONDS = 40.0  # under the suite's 60 s barrier, so a stalled step fails here, naming the test


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def run_before_deadline(session: Any, fetches: Any) -> Any:
    """Session.run(fetches) in a helper thread; fail the test if it has not returned by the deadline."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = session.run(fetches)
        except BaseException as error:  # handed to the test's thread below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE_SECONDS)
    if thread.is_alive():
        pytest.fail(f"Session.run did not return within {DEADLINE_SECONDS} s (rank {hvd.rank()})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def session(graph: tf.Graph, inter_op_threads: int) -> Any:
    """A session with TensorFlow's default inter-op pool (0: one thread per core) or the given size."""
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads)
    return tf.compat.v1.Session(graph=graph, config=config)


def build_in_rank_order(make: Callable[[int], tf.Tensor]) -> list[tf.Tensor]:
    """Create COUNT ops with make(i), in ascending order on even ranks and descending on odd ones."""
    order = range(COUNT) if hvd.rank() % 2 == 0 else reversed(range(COUNT))
    made = {i: make(i) for i in order}
    return [made[i] for i in range(COUNT)]


# -- many independent collectives in one Session.run ------------------------------------------------


@pytest.mark.parametrize("inter_op_threads", [0, 1])
def test_independent_allgathers_in_one_session_run(inter_op_threads: int) -> None:
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        outs = build_in_rank_order(
            lambda i: hvd.allgather(tf.fill([rank + 1, 2], float(i * 10 + rank)), name=f"graph_gather_{i}"))
    with session(graph, inter_op_threads) as sess:
        for _ in range(2):  # the second step reuses the names (and the engine's cached responses)
            values = run_before_deadline(sess, outs)
            for i, value in enumerate(values):
                expected = np.concatenate([np.full([r + 1, 2], float(i * 10 + r)) for r in range(size)])
                np.testing.assert_array_equal(value, expected)


@pytest.mark.parametrize("inter_op_threads", [0, 1])
def test_independent_allreduces_in_one_session_run(inter_op_threads: int) -> None:
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        # Unnamed: each collective's name comes from its input tensor's name, the same on every rank.
        outs = build_in_rank_order(
            lambda i: hvd.allreduce(tf.fill([3], float(i + rank), name=f"reduce_input_{i}"), op=hvd.Sum))
    with session(graph, inter_op_threads) as sess:
        values = run_before_deadline(sess, outs)
    for i, value in enumerate(values):
        np.testing.assert_array_equal(value, np.full([3], float(i * size + sum(range(size)))))


def test_independent_collectives_of_every_kind_in_one_session_run() -> None:
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.fill([size * 2, 2], float(rank))
        kinds = [
            lambda i: hvd.allreduce(x, op=hvd.Sum, name=f"mixed_reduce_{i}"),
            lambda i: hvd.allgather(x, name=f"mixed_gather_{i}"),
            lambda i: hvd.broadcast(x, root_rank=0, name=f"mixed_bcast_{i}"),
            lambda i: hvd.alltoall(x, name=f"mixed_alltoall_{i}"),
            lambda i: hvd.reducescatter(x, op=hvd.Sum, name=f"mixed_scatter_{i}"),
            lambda i: hvd.grouped_allreduce([x, x[0]], op=hvd.Sum, name=f"mixed_group_{i}")[1],
        ]
        outs = build_in_rank_order(lambda i: kinds[i % len(kinds)](i))
    with session(graph, 0) as sess:
        values = run_before_deadline(sess, outs)
    total = float(sum(range(size)))
    for i, value in enumerate(values):
        kind = i % len(kinds)
        if kind == 0:
            np.testing.assert_array_equal(value, np.full([size * 2, 2], total))
        elif kind == 1:
            assert value.shape == (size * size * 2, 2)
        elif kind == 2:
            np.testing.assert_array_equal(value, np.zeros([size * 2, 2]))
        elif kind == 3:
            np.testing.assert_array_equal(value[:, 0], np.repeat(np.arange(size, dtype=float), 2))
        elif kind == 4:
            np.testing.assert_array_equal(value, np.full([2, 2], total))
        else:
            np.testing.assert_array_equal(value, np.full([2], total))


# -- errors ------------------------------------------------------------------------------------------

@pytest.mark.min_ranks(2)
@pytest.mark.parametrize("where", ["session", "function"])
def test_mismatch_in_a_graph_is_failed_precondition_with_the_message(where: str) -> None:
    odd = hvd.rank() == hvd.size() - 1
    x = tf.ones([6 if odd else 5, 2])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"Mismatched ALLREDUCE tensor shapes for 'allreduce.graph_message_\w+': "
                             r"\[5, 2\] on ranks? \[0"):
        if where == "function":
            tf.function(lambda t: hvd.allreduce(t, name="graph_message_function"))(x)
        else:
            graph = tf.Graph()
            with graph.as_default():
                out = hvd.allreduce(tf.constant(x.numpy()), name="graph_message_session")
            with session(graph, 0) as sess:
                run_before_deadline(sess, out)


@pytest.mark.min_ranks(2)
def test_shape_mismatch_in_session_is_failed_precondition() -> None:
    odd = hvd.rank() == hvd.size() - 1
    graph = tf.Graph()
    with graph.as_default():
        out = hvd.allreduce(tf.ones([18 if odd else 17, 3]), name="graph_shape")
    with session(graph, 0) as sess, pytest.raises(tf.errors.FailedPreconditionError,
                                                  match=r"Mismatched ALLREDUCE tensor shapes"):
        run_before_deadline(sess, out)


@pytest.mark.min_ranks(2)
def test_dtype_mismatch_in_session_is_failed_precondition() -> None:
    odd = hvd.rank() == hvd.size() - 1
    graph = tf.Graph()
    with graph.as_default():
        out = hvd.allgather(tf.ones([2], tf.float64 if odd else tf.float32), name="graph_dtype")
    with session(graph, 0) as sess, pytest.raises(tf.errors.FailedPreconditionError,
                                                  match=r"Mismatched data types"):
        run_before_deadline(sess, out)


@pytest.mark.min_ranks(2)
def test_shape_mismatch_in_function_is_failed_precondition() -> None:
    odd = hvd.rank() == hvd.size() - 1
    fn = tf.function(lambda t: hvd.allreduce(t, name="function_shape"))
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"Mismatched ALLREDUCE tensor shapes"):
        fn(tf.ones([4 if odd else 5]))


def test_bad_root_rank_in_session_is_invalid_argument() -> None:
    graph = tf.Graph()
    with graph.as_default():
        out = hvd.broadcast(tf.ones([2]), root_rank=hvd.size() + 5, name="graph_root")
    with session(graph, 0) as sess, pytest.raises(tf.errors.InvalidArgumentError,
                                                  match=r"invalid root rank"):
        run_before_deadline(sess, out)


def test_eager_mismatch_error_is_still_both_classes() -> None:
    if hvd.size() < 2:
        pytest.skip("a mismatch needs two ranks")
    odd = hvd.rank() == hvd.size() - 1
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"Mismatched ALLREDUCE") as info:
        hvd.allreduce(tf.ones([3 if odd else 2]), name="eager_shape_again")
    assert isinstance(info.value, MismatchError)


# -- gradients ---------------------------------------------------------------------------------------


def test_gradients_of_grouped_collectives_taken_twice_run_together() -> None:
    size = hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant([1.0, 2.0])
        b = tf.constant([3.0])
        reduced = hvd.grouped_allreduce([a, b], op=hvd.Sum, name="graph_group")
        gathered = hvd.grouped_allgather([a, b], name="graph_gather_group")
        first = tf.gradients(tf.reduce_sum(reduced[0] * 2.0) + tf.reduce_sum(gathered[0]), [a, b])
        second = tf.gradients(tf.reduce_sum(reduced[0] * 3.0) + tf.reduce_sum(reduced[1]), [a, b])
    with session(graph, 0) as sess:
        (ga1, gb1), (ga2, gb2) = run_before_deadline(sess, [first, second])
    np.testing.assert_allclose(ga1, np.full([2], 2.0 * size + 1.0))
    assert gb1 is None or np.allclose(gb1, 0.0)
    np.testing.assert_allclose(ga2, np.full([2], 3.0 * size))
    np.testing.assert_allclose(gb2, np.full([1], float(size)))



@pytest.mark.parametrize("inter_op_threads", [0, 1])
def test_rank_and_size_ops_in_a_session_beside_collectives(inter_op_threads: int) -> None:
    graph = tf.Graph()
    with graph.as_default():
        ops = [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op()]
        total = hvd.allreduce(tf.cast(ops[0], tf.float32), op=hvd.Sum, name="graph_rank_sum")
    with session(graph, inter_op_threads) as sess:
        rank, size, local_rank, local_size, summed = run_before_deadline(sess, [*ops, total])
    assert (rank, size, local_rank, local_size) == (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    assert summed == sum(range(hvd.size()))
