"""Names pair collectives across ranks: unnamed calls never mix threads' data, and ranks out of step are told so at once."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import unison as hvd
from unison.errors import InvalidArgumentError, MismatchError, UnnamedThreadError


@pytest.fixture(autouse=True)
def job():
    # Each test starts with fresh unnamed-call counters (some tests leave the ranks out of step).
    hvd.init()
    yield
    hvd.shutdown()


def _in_threads(*targets) -> list[object]:
    results: list[object] = [None] * len(targets)

    def run(index: int) -> None:
        try:
            results[index] = targets[index]()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{i}") for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread hung"
    return results


def test_unnamed_collectives_from_two_threads_are_refused_not_mixed() -> None:
    rank, size = hvd.rank(), hvd.size()

    def worker(tag: int):
        def run() -> list[np.ndarray]:
            out = []
            for step in range(150):
                out.append(hvd.allreduce(np.full(8, 1000.0 * tag + step + rank), op=hvd.Sum))
            return out
        return run

    results = _in_threads(worker(1), worker(2))
    for result in results:
        assert isinstance(result, UnnamedThreadError), result
        assert "Unnamed collectives must come from the thread that called init()" in str(result)
        assert "worker-" in str(result) and "Pass name=..." in str(result)
    # The job is intact and unnamed calls from the init thread still pair correctly.
    total = hvd.allreduce(np.full(3, float(rank)), op=hvd.Sum)
    np.testing.assert_array_equal(total, np.full(3, sum(range(size))))


def test_init_thread_and_a_worker_thread_at_once() -> None:
    rank, size = hvd.rank(), hvd.size()
    expected = [np.full(4, float(step * size + sum(range(size)))) for step in range(100)]

    def main_calls() -> list[np.ndarray]:
        return [hvd.allreduce(np.full(4, float(step + rank)), op=hvd.Sum) for step in range(100)]

    def worker() -> object:
        return hvd.allreduce(np.ones(4), op=hvd.Sum)

    results = _in_threads(worker)
    mine = main_calls()
    assert isinstance(results[0], UnnamedThreadError)
    for got, want in zip(mine, expected):
        np.testing.assert_array_equal(got, want)


def test_named_collectives_from_two_threads_pair_by_name() -> None:
    rank, size = hvd.rank(), hvd.size()

    def worker(tag: int):
        def run() -> list[float]:
            return [float(hvd.allreduce(np.full(8, 1000.0 * tag + step + rank), op=hvd.Sum,
                                        name=f"thread{tag}.{step}")[0]) for step in range(150)]
        return run

    results = _in_threads(worker(1), worker(2))
    for tag, result in zip((1, 2), results):
        assert result == [size * (1000.0 * tag + step) + sum(range(size)) for step in range(150)]


@pytest.mark.min_ranks(2)
def test_a_rank_that_skipped_an_unnamed_call_is_told_at_once() -> None:
    rank, size = hvd.rank(), hvd.size()
    hvd.allreduce(np.ones(2), op=hvd.Sum)  # unnamed call #1 everywhere
    started = time.monotonic()
    if rank == 0:
        # A wrong argument on rank 0 only, caught: call #2 fails locally, before anything is sent.
        with pytest.raises(InvalidArgumentError, match="invalid root rank"):
            hvd.broadcast(np.ones(2), root_rank=size + 5)
    others = re.escape("rank 1" if size == 2 else f"ranks {list(range(1, size))}")
    # Rank 0's next unnamed call is #3, the others' #2: neither can ever be matched.
    with pytest.raises(MismatchError, match=(
            rf"Unnamed collectives are out of step: rank 0 is at unnamed allreduce #3, {others} at #2\.")):
        hvd.allreduce(np.ones(2), op=hvd.Sum)
    assert time.monotonic() - started < 30  # at once, not at the stall shutdown (600 s)


@pytest.mark.min_ranks(3)
def test_a_rank_that_skipped_an_unnamed_call_in_a_process_set_is_told_at_once() -> None:
    # Unnamed calls of a set other than the global one carry the set's id in their names
    # (allreduce.noname.set1.<n>); they are still checked for being out of step, within the set.
    hvd.shutdown()
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    hvd.allreduce(np.ones(1), op=hvd.Sum)  # global unnamed call #1: not counted in the set
    if pair.included():
        assert hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=pair).tolist() == [2.0, 2.0]
        if hvd.rank() == 0:
            with pytest.raises(InvalidArgumentError, match="invalid root rank"):
                hvd.broadcast(np.ones(2), root_rank=2, process_set=pair)  # set call #2, local failure
        with pytest.raises(MismatchError, match=re.escape(
                "Unnamed collectives are out of step in process set 1: rank 0 is at unnamed allreduce #3, "
                "rank 1 at #2.")):
            hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=pair)
    hvd.barrier()


@pytest.mark.min_ranks(2)
def test_allreduce_and_broadcast_under_one_name_is_a_mismatch() -> None:
    rank, size = hvd.rank(), hvd.size()
    last = size - 1
    started = time.monotonic()
    with pytest.raises(MismatchError, match=(
            r"Mismatched operations for 'same': ALLREDUCE on ranks? \[0.*\]; BROADCAST on rank \[" + str(last) + r"\]")):
        if rank == last:
            hvd.broadcast(np.ones(3), root_rank=0, name="same")
        else:
            hvd.allreduce(np.ones(3), name="same")
    assert time.monotonic() - started < 30
    # The name is free again on every rank.
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="same")[0] == size
