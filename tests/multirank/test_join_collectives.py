"""Collectives other than allreduce while a rank has joined: an error on their callers, never a wait."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from _coordinator_watch import CoordinatorWatch

import unison as hvd
from unison.errors import HorovodInternalError, MismatchError

# Every wait below ends by this deadline, so a collective that hangs fails the test instead of the job.
DEADLINE_SECONDS = 20.0

MESSAGES = {
    "allgather": "Allgather is not supported with Join at this time. "
    "Specify sparse_as_dense=True if using DistributedOptimizer.",
    "alltoall": "Alltoall is not supported with Join at this time.",
    "broadcast": "Broadcast is not supported with Join at this time.",
    "reducescatter": "Reducescatter is not supported with Join at this time.",
}

# name -> (start it, returning its handles; the message its callers get)
CALLS: dict[str, tuple[Callable[[str, int], list[int]], str]] = {
    "broadcast": (lambda name, size: [hvd.broadcast_async(np.arange(6.0), 0, name=name)],
                  MESSAGES["broadcast"]),
    "broadcast_": (lambda name, size: [hvd.broadcast_async_(np.arange(6.0), 0, name=name)],
                   MESSAGES["broadcast"]),
    "allgather": (lambda name, size: [hvd.allgather_async(np.ones((2, 3)), name=name)],
                  MESSAGES["allgather"]),
    "grouped_allgather": (lambda name, size: [hvd.grouped_allgather_async([np.ones(3), np.ones((1, 2))],
                                                                          name=name)],
                          MESSAGES["allgather"]),
    "alltoall": (lambda name, size: [hvd.alltoall_async(np.arange(2.0 * size), name=name)],
                 MESSAGES["alltoall"]),
    "reducescatter": (lambda name, size: [hvd.reducescatter_async(np.ones(2 * size), name=name)],
                      MESSAGES["reducescatter"]),
    "grouped_reducescatter": (lambda name, size: [hvd.grouped_reducescatter_async(
        [np.ones(2 * size), np.ones((size, 2))], name=name)], MESSAGES["reducescatter"]),
    "broadcast_object": (lambda name, size: [], MESSAGES["broadcast"]),  # blocking: see outcome_of
}


@pytest.fixture(autouse=True)
def fresh_job():
    hvd.shutdown()
    yield
    hvd.shutdown()


@pytest.fixture
def watch() -> Iterator[Callable[[Callable[..., bool]], CoordinatorWatch]]:
    """Start a CoordinatorWatch (after hvd.init(), on every rank); it ends with the test."""
    started: list[CoordinatorWatch] = []

    def start(reached: Callable[..., bool]) -> CoordinatorWatch:
        started.append(CoordinatorWatch(reached, DEADLINE_SECONDS))
        return started[-1]

    yield start
    for one in started:
        one.close()


def has_joined(coordinator) -> bool:
    return coordinator.joined >= 1


def has_pending(coordinator) -> bool:
    return coordinator.pending >= 1


def outcome_of(kind: str, size: int) -> tuple[str, str]:
    """Run collective `kind` and wait for it until the deadline: ('ok' | error class | 'timeout', text)."""
    name = f"while_joined.{kind}"
    try:
        if kind == "broadcast_object":
            hvd.broadcast_object({"step": 3}, root_rank=0, name=name)
            return ("ok", "")
        handles = CALLS[kind][0](name, size)
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not all(hvd.poll(h) for h in handles):
            if time.monotonic() > deadline:
                return ("timeout", f"{kind} still waiting after {DEADLINE_SECONDS} s")
            time.sleep(0.005)
        for handle in handles:
            hvd.synchronize(handle)
    except MismatchError as error:
        assert isinstance(error, HorovodInternalError) and isinstance(error, RuntimeError)
        return (type(error).__name__, str(error))
    return ("ok", "")


@pytest.mark.min_ranks(2)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("joined_rank", ["first", "last"])
@pytest.mark.parametrize("kind", list(CALLS))
def test_callers_get_horovods_error_and_everyone_can_join(world, watch, kind: str, joined_rank: str) -> None:
    rank, size = world
    hvd.init()
    joined = watch(has_joined)
    joiner = 0 if joined_rank == "first" else size - 1
    started = time.monotonic()
    if rank == joiner:
        outcome: tuple[str, str] = ("joined", "")
        last = hvd.join()  # completes once the callers join after their error
    else:
        joined.wait()  # submit after the join has reached the coordinator (and, below, before it)
        outcome = outcome_of(kind, size)
        last = hvd.join()
    seconds = time.monotonic() - started
    outcomes = hvd.allgather_object((outcome, last, seconds))
    callers = [r for r in range(size) if r != joiner]
    message = f"{CALLS[kind][1]} Joined rank [{joiner}]."
    assert [o[0] for o in outcomes] == [
        ("joined", "") if r == joiner else ("MismatchError", message) for r in range(size)
    ]
    assert len({o[1] for o in outcomes}) == 1 and outcomes[0][1] in callers
    assert max(o[2] for o in outcomes) < DEADLINE_SECONDS
    # every rank goes on: the joined state is over, and every kind runs again
    assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="after")[0] == size
    assert hvd.broadcast(np.full(2, float(rank)), root_rank=size - 1, name="after.b").tolist() == [size - 1] * 2


@pytest.mark.min_ranks(2)
@pytest.mark.timeout(90)
def test_a_collective_already_waiting_fails_when_the_last_missing_rank_joins(world, watch) -> None:
    rank, size = world
    hvd.init()
    waiting = watch(has_pending)
    joiner = size - 1
    if rank == joiner:
        waiting.wait()  # the others' allgather waits for this rank, which joins instead
        outcome: tuple[str, str] = ("joined", "")
        hvd.join()
    else:
        outcome = outcome_of("allgather", size)
        hvd.join()
    outcomes = hvd.allgather_object(outcome)
    message = f"{MESSAGES['allgather']} Joined rank [{joiner}]."
    assert outcomes == [("joined", "") if r == joiner else ("MismatchError", message) for r in range(size)]


@pytest.mark.min_ranks(3)
@pytest.mark.timeout(90)
def test_a_process_set_without_the_joined_rank_runs_every_collective(world, watch) -> None:
    rank, size = world
    others = hvd.ProcessSet(range(size - 1))
    hvd.init(process_sets=[others])
    joined = watch(has_joined)
    if rank == size - 1:
        last = hvd.join()
        assert hvd.allgather_object(last) == [last] * size and last < size - 1
        return
    joined.wait()  # submit while rank size - 1 has joined
    handles = [
        hvd.broadcast_async(np.full(2, float(rank)), root_rank=1, name="set.b", process_set=others),
        hvd.allgather_async(np.array([rank]), name="set.g", process_set=others),
    ]
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not all(hvd.poll(h) for h in handles):
        assert time.monotonic() < deadline, "the process set's collectives did not complete"
        time.sleep(0.005)
    assert hvd.synchronize(handles[0]).tolist() == [1.0, 1.0]
    assert hvd.synchronize(handles[1]).tolist() == list(range(size - 1))
    # the rest of the world set still refuses them while rank size - 1 has joined
    with pytest.raises(MismatchError, match=rf"^Broadcast is not supported with Join at this time\. "
                                            rf"Joined rank \[{size - 1}\]\.$"):
        hvd.broadcast(np.ones(1), root_rank=0, name="world.b")
    last = hvd.join()
    assert hvd.allgather_object(last) == [last] * size
