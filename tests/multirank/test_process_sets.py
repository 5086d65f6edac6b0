"""Process sets: registered at init or dynamically, collectives run among members only."""

from __future__ import annotations

import numpy as np
import pytest

import unison as hvd
from unison.errors import ConfigError, InvalidArgumentError


@pytest.fixture(autouse=True)
def fresh_job():
    hvd.shutdown()
    yield
    hvd.shutdown()


@pytest.mark.min_ranks(2)
def test_static_process_sets() -> None:
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    head = hvd.ProcessSet([0])
    tail = hvd.ProcessSet(range(1, size))
    hvd.init(process_sets=[head, tail])
    rank = hvd.rank()
    assert (head.process_set_id, tail.process_set_id) == (1, 2)
    assert tail.included() == (rank > 0) and head.included() == (rank == 0)
    assert tail.rank() == (rank - 1 if rank > 0 else None)
    if tail.included():
        out = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum, name="tail", process_set=tail)
        np.testing.assert_array_equal(out, np.full(3, float(sum(r + 1 for r in range(1, size)))))
        out = hvd.broadcast(np.full(2, rank), root_rank=size - 1, name="tailb", process_set=tail)
        assert out.tolist() == [size - 1] * 2
        gathered = hvd.allgather(np.array([rank]), name="tailg", process_set=tail)
        assert gathered.tolist() == list(range(1, size))
        with pytest.raises(InvalidArgumentError, match="invalid root rank 0"):
            hvd.broadcast(np.ones(1), root_rank=0, process_set=tail)
    else:
        with pytest.raises(InvalidArgumentError, match=f"Allreduce: Rank {rank} is not a member"):
            hvd.allreduce(np.ones(1), process_set=tail)
        out = hvd.allreduce(np.full(2, 5.0), op=hvd.Average, name="head", process_set=head)
        assert out.tolist() == [5.0, 5.0]  # a one-rank set averages over itself
    # unnamed object broadcasts inside a set do not disturb later global ones
    if tail.included():
        assert hvd.broadcast_object("x" if rank == 1 else None, root_rank=1, process_set=tail) == "x"
    assert hvd.broadcast_object("g" if rank == 0 else None) == "g"
    # the global set still works for everyone
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="global")[0] == size


@pytest.mark.min_ranks(2)
def test_dynamic_process_sets() -> None:
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    ps = hvd.add_process_set(list(range(size - 1, 0, -1)))  # every rank but 0, given unsorted
    assert ps.ranks == list(range(1, size)) and ps.process_set_id is not None
    with pytest.raises(InvalidArgumentError, match="Attempted to add a duplicate process set"):
        hvd.add_process_set(list(range(size)))  # the global set
    if ps.included():
        out = hvd.allreduce(np.full(2, float(rank)), op=hvd.Sum, name="dyn", process_set=ps)
        assert out.tolist() == [float(sum(range(1, size)))] * 2
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None
    assert hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.remove")[0] == size


def test_dynamic_sets_need_opt_in() -> None:
    hvd.init()
    with pytest.raises(ConfigError, match="UNISON_DYNAMIC_PROCESS_SETS=1"):
        hvd.add_process_set([0])


@pytest.mark.min_ranks(2)
def test_unnamed_calls_of_different_sets_pending_at_the_same_time() -> None:
    from _coordinator_watch import CoordinatorWatch
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    evens, odds = hvd.ProcessSet(range(0, size, 2)), hvd.ProcessSet(range(1, size, 2))
    hvd.init(process_sets=[evens, odds])
    mine = evens if hvd.rank() % 2 == 0 else odds
    odds_waiting = CoordinatorWatch(lambda coordinator: coordinator.pending >= 1, deadline_seconds=20.0)
    if hvd.rank() % 2:
        # The odd ranks wait in the global barrier and allreduce while the even ranks pass their
        # own set's: the first unnamed call of each set is not the first of the global set.
        hvd.barrier()
        hvd.barrier(process_set=odds)
        total = hvd.allreduce(np.ones(1), op=hvd.Sum)
        in_set = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=odds)
    else:
        odds_waiting.wait()  # the odd ranks' global barrier has reached the coordinator
        hvd.barrier(process_set=evens)
        in_set = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=evens)
        hvd.barrier()
        total = hvd.allreduce(np.ones(1), op=hvd.Sum)
    odds_waiting.close()
    assert (total[0], in_set[0]) == (size, len(mine.ranks))
    for _ in range(3):  # and each set's barrier, both at once
        hvd.barrier(process_set=mine)
    out = hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.set.barriers", process_set=mine)
    assert out[0] == len(mine.ranks)
    hvd.barrier()  # no rank shuts the job down while the other set still runs its calls


@pytest.mark.min_ranks(2)
def test_duplicate_sets_at_init_leave_the_job_initialized_and_init_again_binds() -> None:
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    listed = [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, size)),
              hvd.ProcessSet(range(size - 1, -1, -1)),  # every rank: the global set again
              hvd.ProcessSet([0])]  # the first one again
    with pytest.raises(ValueError, match=r"Attempted to add a duplicate process set: ProcessSet\(process_set_id="
                                         r"None, ranks=\[0, 1.*the global process set's.*call init\(process_sets"):
        hvd.init(comm=MPI.COMM_WORLD, process_sets=listed)
    # As in Horovod: initialized, with the sets that were not duplicates.
    assert hvd.is_initialized() and hvd.size() == size
    assert [ps.process_set_id for ps in listed] == [1, 2, None, None]
    first, rest = hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, size)))
    hvd.init(comm=MPI.COMM_WORLD, process_sets=[first, rest])  # binds the new objects
    assert (first.process_set_id, rest.process_set_id) == (1, 2)
    if rest.included():
        out = hvd.allreduce(np.ones(1), op=hvd.Sum, name="rest.after.reinit", process_set=rest)
        assert out[0] == size - 1
    hvd.barrier()  # no rank shuts the job down before every rank called init() below
    if size > 2:
        with pytest.raises(ValueError, match=r"init\(\) was called again with ProcessSet\(.*ranks=\[0, 1\].*are "
                                             r"not a registered process set"):
            hvd.init(process_sets=[hvd.ProcessSet([0, 1])])
    hvd.shutdown()
    assert rest.process_set_id is None and first.process_set_id is None


@pytest.mark.min_ranks(2)
def test_sets_from_communicators_keep_them_and_a_split_registers_every_color() -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    halves = world.Split(color=rank % 2, key=rank)
    mine = hvd.ProcessSet(halves)
    hvd.init(comm=world, process_sets=[mine])
    # As in Horovod: a set made from a communicator reports it, the global set the one init() was given.
    assert hvd.global_process_set.mpi_comm == world and mine.mpi_comm is halves
    # Each rank passes its own color's communicator: both colors are registered, evens first.
    color = list(range(rank % 2, size, 2))
    assert (mine.process_set_id, mine.ranks) == (1 + rank % 2, color)
    out = hvd.allreduce(np.array([rank]), op=hvd.Sum, name="halves", process_set=mine)
    assert out[0] == sum(color)
    hvd.barrier()  # no rank shuts the job down while the other color still runs its allreduce
