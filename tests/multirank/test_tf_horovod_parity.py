"""unison.tensorflow where Horovod's scripts and tests reach past the collectives: the process-set table
through ``hvd.mpi_ops._basics``, sets checked when an op is built, ranks outside a tape's set, and the
partial tape's split of local and global gradients."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

tf = pytest.importorskip("tensorflow")

import unison.tensorflow as hvd  # noqa: E402

SIZE = MPI.COMM_WORLD.Get_size()
HEAD = hvd.ProcessSet([0])
TAIL = hvd.ProcessSet(range(1, SIZE)) if SIZE > 1 else None


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init(process_sets=[HEAD, TAIL] if TAIL is not None else None)
    yield
    hvd.shutdown()


def test_the_process_set_table_reads_as_horovods_basics_object() -> None:
    basics = hvd.mpi_ops._basics
    table = basics._get_process_set_ids_and_ranks()
    if TAIL is None:  # one rank: [0] is the global set, so HEAD was refused as its duplicate
        assert table == {0: [0]}
        return
    assert table == {0: list(range(SIZE)), 1: [0], 2: list(range(1, SIZE))}
    assert (basics._process_set_size(1), basics._process_set_size(2)) == (1, SIZE - 1)
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match=r"Process is not part of provided process set: rank 0 is not in "
                                             r"process set 2 \(ranks \[1"):
            basics._process_set_rank(2)
    else:
        assert basics._process_set_rank(2) == hvd.rank() - 1
    with pytest.raises(ValueError, match=r"Process set does not exist or has not been registered. Got "
                                         r"process_set_id=9"):
        basics._process_set_size(9)


def _unregistered() -> hvd.ProcessSet:
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10  # set by hand: never registered with the job
    return fake


COLLECTIVES = {
    "allreduce": lambda x, ps: hvd.allreduce(x, process_set=ps),
    "grouped_allreduce": lambda x, ps: hvd.grouped_allreduce([x], process_set=ps),
    "allgather": lambda x, ps: hvd.allgather(x, process_set=ps),
    "broadcast": lambda x, ps: hvd.broadcast(x, 0, process_set=ps),
    "alltoall": lambda x, ps: hvd.alltoall(x, process_set=ps),
    "reducescatter": lambda x, ps: hvd.reducescatter(x, process_set=ps),
}


@pytest.mark.parametrize("kind", sorted(COLLECTIVES))
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_an_unregistered_set_is_refused_when_the_op_is_built(kind: str, mode: str) -> None:
    # As Horovod's ops: ValueError while the op is built, also in a graph (not when it runs).
    match = r"Process set does not exist or has not been registered: ProcessSet\(process_set_id=10, ranks=\[0\]"
    if mode == "graph":
        with tf.Graph().as_default(), pytest.raises(ValueError, match=match):
            COLLECTIVES[kind](tf.ones([4]), _unregistered())
    else:
        with pytest.raises(ValueError, match=match):
            COLLECTIVES[kind](tf.ones([4]), _unregistered())


@pytest.mark.min_ranks(2)
@pytest.mark.parametrize("where", ["eager", "function"])
def test_a_rank_outside_the_tapes_set_gets_its_own_gradients(where: str) -> None:
    assert TAIL is not None
    x = tf.constant(float(hvd.rank() + 1))

    def gradient() -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        return hvd.DistributedGradientTape(tape, process_set=TAIL).gradient(y, [x])[0]

    got = float(tf.function(gradient)() if where == "function" else gradient())
    if hvd.rank() == 0:  # not in TAIL: Horovod's tape leaves the gradient unreduced there
        assert got == 2.0
    else:  # the average of 2 * (r + 1) over the ranks r of TAIL
        assert got == pytest.approx(2.0 * np.mean([r + 1 for r in range(1, SIZE)]))


@pytest.mark.min_ranks(2)
def test_the_partial_tape_splits_local_and_global_gradients() -> None:
    local = tf.Variable([float(hvd.rank() + 1)], name="local")
    shared = tf.Variable([float(hvd.rank() + 1)], name="shared")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(local * local + shared * shared)
    tape = hvd.PartialDistributedGradientTape(tape)
    tape.register_local_source(local)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, [local, shared])
    assert [v is local for v, _ in local_pairs] == [True] and [v is shared for v, _ in global_pairs] == [True]
    # the local gradient stays this rank's, divided by the size (scale_local_gradients); the other is averaged
    np.testing.assert_allclose(local_pairs[0][1].numpy(), [2.0 * (hvd.rank() + 1) / SIZE])
    np.testing.assert_allclose(global_pairs[0][1].numpy(), [2.0 * np.mean(np.arange(1, SIZE + 1))])
