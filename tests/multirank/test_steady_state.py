"""The steady state: a cached call runs its cycle on the caller's thread, and every guarantee holds there.

A blocking call whose response is cached on every rank runs on the thread that makes it
(`Engine.run_now`, `Cycles.solo`): one summary exchange, then the data. These cases make that path
meet what it must still catch: a rank that changes a cached call (a mismatch on every rank, before any
result), names that leave the cache, two threads calling at once, ranks calling different cached
names (each falls back to a whole cycle and they still meet).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import unison as hvd
from unison._job import runtime
from unison.errors import MismatchError


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def _mine(n: int = 8, dtype: type = np.float32) -> np.ndarray:
    return np.arange(n, dtype=dtype) + 100 * hvd.rank()


def _sum(n: int = 8, dtype: type = np.float32) -> np.ndarray:
    return sum(np.arange(n, dtype=dtype) + 100 * r for r in range(hvd.size()))  # type: ignore[return-value]


def test_a_cached_call_runs_on_the_callers_thread_with_the_exact_result() -> None:
    hvd.allreduce(_mine(), name="steady.x", op=hvd.Sum)  # negotiated once, then cached
    before = runtime.job().engine.statistics()
    for _ in range(50):
        np.testing.assert_array_equal(hvd.allreduce(_mine(), name="steady.x", op=hvd.Sum), _sum())
        np.testing.assert_allclose(hvd.allreduce(_mine(), name="steady.avg"), _sum() / hvd.size())
    after = runtime.job().engine.statistics()
    # no hand-off to the engine thread but where it was running an idle cycle at the time
    assert after.driven_cycles - before.driven_cycles >= 90
    assert after.cache.hits - before.cache.hits >= 99
    if runtime.job().engine.backend.reduces_status:  # (the gRPC control plane gathers rows every cycle)
        assert after.rows_gathered - before.rows_gathered < 10  # a summary alone decided the others


@pytest.mark.min_ranks(2)
def test_a_cached_call_changed_on_one_rank_is_a_mismatch_on_every_rank_and_the_name_works_again() -> None:
    last = hvd.size() - 1
    for _ in range(3):
        hvd.allreduce(_mine(4), name="steady.changed", op=hvd.Sum)
    odd = hvd.rank() == last
    with pytest.raises(MismatchError, match=r"Mismatched ALLREDUCE tensor shapes for 'allreduce.steady.changed'"):
        hvd.allreduce(_mine(5 if odd else 4), name="steady.changed", op=hvd.Sum)
    with pytest.raises(MismatchError, match=r"Mismatched reduction operation .*'allreduce.steady.changed'"):
        hvd.allreduce(_mine(4), name="steady.changed", op=hvd.Max if odd else hvd.Sum)
    for _ in range(3):  # negotiated again, then cached again
        np.testing.assert_array_equal(hvd.allreduce(_mine(4), name="steady.changed", op=hvd.Sum), _sum(4))


@pytest.mark.min_ranks(2)
def test_ranks_calling_different_cached_names_still_meet() -> None:
    # Every rank calls both names, in an order of its own: each rank's first call finds no partner
    # in its own cycle, falls back to a whole cycle and waits; the second call completes the pair.
    for name in ("steady.a", "steady.b"):
        hvd.allreduce(_mine(), name=name, op=hvd.Sum)
    results: dict[str, np.ndarray] = {}
    order = ("steady.a", "steady.b") if hvd.rank() % 2 == 0 else ("steady.b", "steady.a")
    handles = {name: hvd.allreduce_async(_mine(), name=name, op=hvd.Sum) for name in order}
    for name in order:
        results[name] = hvd.synchronize(handles[name])
    for name in order:
        np.testing.assert_array_equal(results[name], _sum())


def test_two_threads_calling_cached_names_at_once_get_their_own_results() -> None:
    errors: list[BaseException] = []

    def work(label: str, scale: float) -> None:
        try:
            for step in range(100):
                got = hvd.allreduce(_mine() * scale + step, name=f"steady.thread.{label}", op=hvd.Sum)
                np.testing.assert_allclose(got, _sum() * scale + step * hvd.size())
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    other = threading.Thread(target=work, args=("other", 3.0))
    other.start()
    work("main", 1.0)
    other.join(120)
    assert not other.is_alive()
    assert not errors, errors


def test_an_async_call_and_a_blocking_call_from_one_thread() -> None:
    handle = hvd.allreduce_async(_mine(), name="steady.async", op=hvd.Sum)
    np.testing.assert_array_equal(hvd.allreduce(_mine(), name="steady.blocking", op=hvd.Sum), _sum())
    np.testing.assert_array_equal(hvd.synchronize(handle), _sum())


def test_names_that_leave_the_cache_are_negotiated_again(monkeypatch) -> None:
    hvd.shutdown()
    monkeypatch.setenv("UNISON_CACHE_CAPACITY", "2")
    hvd.init()
    try:
        for step in range(20):
            for name in ("steady.e1", "steady.e2", "steady.e3"):  # three names, two slots: evictions
                got = hvd.allreduce(_mine() + step, name=name, op=hvd.Sum)
                np.testing.assert_array_equal(got, _sum() + step * hvd.size())
        stats = runtime.job().engine.statistics().cache
        assert stats.evictions > 0 and stats.entries <= 2
    finally:
        hvd.shutdown()
        monkeypatch.delenv("UNISON_CACHE_CAPACITY")
        hvd.init()
    assert "UNISON_CACHE_CAPACITY" not in os.environ
