"""The lockstep plugin's named barrier itself, checked over real MPI with mpi4py alone (no unison)."""

from __future__ import annotations

import re
import time

import pytest
from mpi4py import MPI

from unison.testing import _barrier


@pytest.mark.min_ranks(2)
def test_every_rank_sees_every_rank(world: tuple[int, int]) -> None:
    rank, size = world
    assert size > 1
    gathered = MPI.COMM_WORLD.allgather(rank)
    assert gathered == list(range(size))
    # Every rank checks that all the others saw the same thing.
    assert MPI.COMM_WORLD.allgather(gathered) == [gathered] * size


@pytest.mark.min_ranks(2)
def test_named_barrier_reports_where_each_rank_is(world: tuple[int, int]) -> None:
    rank, size = world
    barrier = _barrier.NamedBarrier(MPI.COMM_WORLD)
    try:
        same = barrier.wait("probe", 30)
        assert same == dict.fromkeys(range(size), "probe")
        assert _barrier.describe_mismatch(same) is None

        parity = {r: "even" if r % 2 == 0 else "odd" for r in range(size)}
        names = barrier.wait(f"probe {parity[rank]}", 30)
        assert names == {r: f"probe {parity[r]}" for r in range(size)}
        evens = [r for r in range(size) if r % 2 == 0]
        evens_phrase = "rank 0 is" if evens == [0] else f"ranks {evens} are"
        message = _barrier.describe_mismatch(names)
        assert message is not None
        assert re.search(rf"{re.escape(evens_phrase)} at 'probe even'; rank 1 is at 'probe odd'", message)
    finally:
        barrier.comm.Free()


@pytest.mark.min_ranks(2)
def test_named_barrier_times_out_naming_the_absent_ranks(world: tuple[int, int]) -> None:
    rank, size = world
    barrier = _barrier.NamedBarrier(MPI.COMM_WORLD)
    absent = list(range(1, size))
    pending = []
    if rank == 0:
        with pytest.raises(_barrier.BarrierTimeout) as caught:
            barrier.wait("probe", 0.2)
        assert str(caught.value) == f"ranks {absent} did not reach the barrier for probe within 0.2 s"
        assert caught.value.missing_ranks == absent
        pending = caught.value.pending
    # Only now do the other ranks arrive; rank 0's receives, still posted, take their messages.
    MPI.COMM_WORLD.barrier()
    if rank != 0:
        assert barrier.wait("probe", 30) == dict.fromkeys(range(size), "probe")
    while pending:
        pending = [request for request in pending if not request.Test()]
        time.sleep(0.001)
    barrier.comm.Free()
