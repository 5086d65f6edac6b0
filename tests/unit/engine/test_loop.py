"""The engine end to end with N ranks as threads: ordering, exactly-once, results, errors, join, shutdown."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unison.backends.loopback import ThreadGroup
from unison.config import load_settings
from unison.dtypes import DType
from unison.engine.handles import Entry, Handle
from unison.engine.loop import Engine
from unison.errors import DuplicateNameError, MismatchError, ShutdownError
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.messages import Request, Response

TIMEOUT = 20.0


class Job:
    """N engines over a ThreadGroup, each recording the order it executed responses in."""

    def __init__(self, size: int, **overrides: object) -> None:
        overrides.setdefault("idle_cycle_seconds", 0.005)
        overrides.setdefault("stall_check_disable", True)
        self.settings = load_settings({}, **overrides)
        self.group = ThreadGroup(size)
        self.engines = [Engine(self.group.backend(r), self.settings) for r in range(size)]
        self.executed: list[list[tuple[str, ...]]] = [[] for _ in range(size)]
        for rank, engine in enumerate(self.engines):

            def record(response: Response, rank: int = rank) -> None:
                self.executed[rank].append((response.kind, *response.names))

            engine.on_response = record
            engine.start()

    def run_ranks(self, fn: Callable[[int, Engine], object]) -> list[object]:
        results: list[object] = [None] * len(self.engines)
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = fn(rank, self.engines[rank])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
                errors.append(exc)

        threads = [threading.Thread(target=target, args=(r,)) for r in range(len(self.engines))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
            assert not t.is_alive(), "a rank hung"
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        assert self.run_ranks(lambda rank, engine: engine.shutdown(TIMEOUT)) == [True] * len(self.engines)
        assert not any(engine.thread_alive for engine in self.engines)


def allreduce_entry(name: str, rank: int, value: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> Entry:
    dtype = DType(value.dtype.name)
    request = Request(name, CollectiveKind.ALLREDUCE, rank, dtype, value.shape, op)
    return Entry(request, value, np.empty_like(value), Handle(name))


def wait(entry: Entry) -> object:
    assert entry.handle.wait(TIMEOUT), f"{entry.request.name} never completed"
    if entry.handle.error is not None:
        raise entry.handle.error
    return entry.handle.result


@pytest.fixture
def job2():
    job = Job(2)
    yield job
    job.close()


@settings(max_examples=25, deadline=None)
@given(
    size=st.integers(2, 3),
    names=st.lists(st.sampled_from([f"t{i}" for i in range(10)]), min_size=1, max_size=8, unique=True),
    steps=st.integers(1, 3),
    capacity=st.sampled_from([0, 2, 1024]),
    threshold=st.sampled_from([0, 64, 1 << 20]),
    data=st.data(),
)
def test_same_order_everywhere_exactly_once_with_correct_sums(size, names, steps, capacity, threshold, data):
    orders = [[data.draw(st.permutations(names)) for _ in range(steps)] for _ in range(size)]
    lengths = {n: data.draw(st.integers(1, 20)) for n in names}
    job = Job(size, cache_capacity=capacity, fusion_threshold_bytes=threshold)
    try:
        def work(rank: int, engine: Engine) -> None:
            for step in range(steps):
                entries = []
                for name in orders[rank][step]:
                    value = np.full(lengths[name], float(rank + 1 + step), dtype=np.float32)
                    entry = allreduce_entry(name, rank, value)
                    engine.enqueue([entry])
                    entries.append(entry)
                expected = sum(r + 1 + step for r in range(size))
                for entry in entries:
                    np.testing.assert_array_equal(wait(entry), np.full(lengths[entry.request.name], expected))

        job.run_ranks(work)
    finally:
        job.close()
    ran = [[names_ for kind, *names_ in log if kind == "allreduce"] for log in job.executed]
    assert all(r == ran[0] for r in ran), "ranks executed different sequences"
    flat = sorted(n for group in ran[0] for n in group)
    assert flat == sorted(names * steps)


def test_duplicate_name_in_flight_raises_at_once(job2: Job) -> None:
    value = np.ones(2, np.float32)
    job2.engines[0].enqueue([allreduce_entry("dup", 0, value)])
    with pytest.raises(DuplicateNameError, match="'dup' while another tensor with that name"):
        job2.engines[0].enqueue([allreduce_entry("dup", 0, value)])
    job2.engines[1].enqueue([allreduce_entry("dup", 1, value)])


def test_one_name_under_two_kinds_in_flight_raises_at_once(job2: Job) -> None:
    value = np.ones(2, np.float32)
    job2.engines[0].enqueue([allreduce_entry("allreduce.w", 0, value)])
    request = Request("broadcast.w", CollectiveKind.BROADCAST, 0, DType.FLOAT32, (2,), root_rank=0)
    with pytest.raises(DuplicateNameError, match="named 'w' while 'allreduce.w' is still being processed"):
        job2.engines[0].enqueue([Entry(request, value, np.empty_like(value), Handle("broadcast.w"))])
    job2.engines[1].enqueue([allreduce_entry("allreduce.w", 1, value)])


def test_mismatch_fails_on_every_rank_and_the_job_continues(job2: Job) -> None:
    def work(rank: int, engine: Engine) -> object:
        bad = allreduce_entry("m", rank, np.ones(2 + rank, np.float32))
        engine.enqueue([bad])
        with pytest.raises(MismatchError, match=r"\[2\] on rank \[0\]; \[3\] on rank \[1\]"):
            wait(bad)
        good = allreduce_entry("g", rank, np.ones(2, np.float32))
        engine.enqueue([good])
        return wait(good)

    for result in job2.run_ranks(work):
        np.testing.assert_array_equal(result, [2, 2])


def test_cache_mismatch_after_steady_state_is_caught(job2: Job) -> None:
    """A name that hit the cache is later resubmitted with another shape on one rank only."""
    def work(rank: int, engine: Engine) -> None:
        for _ in range(3):
            entry = allreduce_entry("c", rank, np.ones(4, np.float32))
            engine.enqueue([entry])
            wait(entry)
        entry = allreduce_entry("c", rank, np.ones(4 + rank, np.float32))
        engine.enqueue([entry])
        with pytest.raises(MismatchError, match="Mismatched ALLREDUCE tensor shapes for 'c'"):
            wait(entry)

    job2.run_ranks(work)
    stats = job2.engines[0].statistics()
    assert stats.cache_hits_executed >= 2
    plain = json.loads(json.dumps(dataclasses.asdict(stats)))  # a snapshot of plain data
    assert plain["cache"]["hits"] == stats.cache.hits and plain["backend"] == stats.backend


def test_join_contributes_zeros_and_returns_last_rank() -> None:
    job = Job(3)
    try:
        def work(rank: int, engine: Engine) -> object:
            steps = rank + 1  # uneven: rank 0 does 1 step, rank 2 does 3
            for step in range(steps):
                entry = allreduce_entry(f"s{step}", rank, np.full(2, 1.0, np.float32))
                engine.enqueue([entry])
                result = wait(entry)
                assert result.tolist() == [3 - step] * 2  # ranks that joined add zeros
            join = Entry(Request("join.noname", CollectiveKind.JOIN, rank), None, None, Handle("join"))
            engine.enqueue([join])
            return wait(join)

        assert job.run_ranks(work) == [2, 2, 2]
    finally:
        job.close()


def test_shutdown_fails_pending_ops_with_the_ranks_named(job2: Job) -> None:
    entry = allreduce_entry("never", 0, np.ones(1, np.float32))
    job2.engines[0].enqueue([entry])
    job2.engines[1].shutdown(timeout=TIMEOUT)
    with pytest.raises(ShutdownError, match=r"rank\(s\) \[1\] called shutdown\(\)"):
        wait(entry)
    with pytest.raises(ShutdownError):
        job2.engines[0].enqueue([allreduce_entry("late", 0, np.ones(1, np.float32))])


@settings(max_examples=25, deadline=None)
@given(size=st.integers(2, 3), steps=st.integers(1, 4), capacity=st.sampled_from([1, 2, 3, 1024]),
       data=st.data())
def test_groups_run_whole_and_once_under_cache_pressure(size, steps, capacity, data):
    """Groups g0 (3 tensors) and g1 (2) plus a loose tensor, submitted in random orders."""
    layout = {"g0": 3, "g1": 2, "loose": 1}
    orders = [[data.draw(st.permutations(list(layout))) for _ in range(steps)] for _ in range(size)]
    job = Job(size, cache_capacity=capacity)
    try:
        def work(rank: int, engine: Engine) -> None:
            for step in range(steps):
                pending = []
                for group in orders[rank][step]:
                    count = layout[group]
                    entries = [
                        allreduce_entry(f"{group}_{i + 1}of{count}" if count > 1 else group, rank,
                                        np.full(3, float(rank + step), np.float32))
                        for i in range(count)
                    ]
                    if count > 1:
                        entries = [Entry(dataclasses.replace(e.request, group=group, group_size=count),
                                         e.input, e.output, e.handle) for e in entries]
                    engine.enqueue(entries)
                    pending += entries
                expected = sum(r + step for r in range(size))
                for entry in pending:
                    np.testing.assert_array_equal(wait(entry), [expected] * 3)

        job.run_ranks(work)
    finally:
        job.close()
    logs = [[tuple(names) for kind, *names in log if kind == "allreduce"] for log in job.executed]
    assert all(log == logs[0] for log in logs)
    for names in logs[0]:
        groups = {n.split("_")[0] for n in names if "of" in n}
        for g in groups:  # a fused response holds whole groups
            assert sum(n.startswith(g + "_") for n in names) == layout[g]
    total = sum(len(names) for names in logs[0])
    assert total == steps * sum(layout.values())


@settings(max_examples=20, deadline=None)
@given(capacity=st.sampled_from([0, 2, 1024]), steps=st.integers(1, 3), data=st.data())
def test_process_set_tensors_run_only_among_members(capacity, steps, data):
    """Size 3 with a set {0, 2}: set tensors and global tensors interleave in random orders."""
    size, members = 3, (0, 2)
    global_names = ["g0", "g1"]
    set_names = ["p0", "p1", "p2"]
    orders = []
    for rank in range(size):
        mine = global_names + (set_names if rank in members else [])
        orders.append([data.draw(st.permutations(mine)) for _ in range(steps)])
    settings_ = load_settings({}, idle_cycle_seconds=0.005, stall_check_disable=True,
                              cache_capacity=capacity)
    group = ThreadGroup(size)
    group._add(1, members)
    engines = [Engine(group.backend(r), settings_, {0: (0, 1, 2), 1: members}) for r in range(size)]
    for engine in engines:
        engine.start()
    job = Job.__new__(Job)
    job.engines, job.group = engines, group
    try:
        def work(rank: int, engine: Engine) -> None:
            for step in range(steps):
                entries = []
                for name in orders[rank][step]:
                    value = np.full(2, float(rank + 1), np.float32)
                    entry = allreduce_entry(name, rank, value)
                    if name.startswith("p"):
                        entry = Entry(dataclasses.replace(entry.request, process_set_id=1),
                                      entry.input, entry.output, entry.handle)
                    engine.enqueue([entry])
                    entries.append(entry)
                for entry in entries:
                    ranks = members if entry.request.process_set_id == 1 else range(size)
                    np.testing.assert_array_equal(wait(entry), [sum(r + 1 for r in ranks)] * 2)

        job.run_ranks(work)
    finally:
        job.close()


def test_cycle_time_spaces_cycles() -> None:
    """UNISON_CYCLE_TIME is a minimum time between cycle starts (idle cycles would otherwise run
    every idle_cycle_seconds = 5 ms here)."""
    job = Job(2, cycle_time_seconds=0.1)
    try:
        start = [e.statistics().cycles for e in job.engines]
        __import__("time").sleep(0.5)
        ran = [e.statistics().cycles - s for e, s in zip(job.engines, start)]
        assert all(r <= 7 for r in ran), ran  # at most one cycle per 100 ms (+ slack)
        value = np.ones(2, np.float32)

        def work(rank: int, engine: Engine) -> object:
            entry = allreduce_entry("spaced", rank, value)
            engine.enqueue([entry])
            return wait(entry)

        for result in job.run_ranks(work):
            np.testing.assert_array_equal(result, [2, 2])
    finally:
        job.close()


def test_batch_holds_submissions_until_it_ends_then_one_cycle_runs_them_fused(job2: Job) -> None:
    values = [np.full(3, float(i + 1), np.float32) for i in range(4)]

    def rank_fn(rank: int, engine: Engine) -> list[object]:
        entries = [allreduce_entry(f"b{i}", rank, v.copy()) for i, v in enumerate(values)]
        with engine.batch():
            for entry in entries[:2]:
                engine.enqueue([entry])
            with engine.batch():  # nested: only the outermost block releases
                for entry in entries[2:]:
                    engine.enqueue([entry])
            stats = engine.statistics()
            assert (stats.queued, stats.held) == (0, 4), "a held submission reached the engine early"
            assert not any(e.handle.done() for e in entries)
        return [wait(e) for e in entries]

    results = job2.run_ranks(rank_fn)
    for per_rank in results:
        for got, v in zip(per_rank, values):  # type: ignore[call-overload]
            np.testing.assert_array_equal(got, 2 * v)
    for executed in job2.executed:
        # all four negotiated in one cycle and fused into one response
        assert [names for names in executed if names[0] == "allreduce"] == [("allreduce", "b0", "b1", "b2", "b3")]


def test_a_stop_fails_the_submissions_a_batch_holds(job2: Job) -> None:
    engine = job2.engines[0]
    entry = allreduce_entry("held", 0, np.ones(1, np.float32))
    with engine.batch():
        engine.enqueue([entry])
        job2.engines[1].shutdown(timeout=TIMEOUT)
        assert engine.wait_stopped(TIMEOUT)
        with pytest.raises(ShutdownError):
            wait(entry)
        with pytest.raises(ShutdownError):
            engine.enqueue([allreduce_entry("late", 0, np.ones(1, np.float32))])
    assert (engine.statistics().queued, engine.statistics().held) == (0, 0)


def test_shutdown_reports_peers_that_never_answered() -> None:
    settings = load_settings({}, idle_cycle_seconds=0.005, stall_check_disable=True)
    group = ThreadGroup(2)
    lonely = Engine(group.backend(0), settings)  # rank 1's engine never starts
    lonely.start()
    assert lonely.shutdown(timeout=0.3) is False
    assert lonely.state == "stopped"
    both = ThreadGroup(2)
    engines = [Engine(both.backend(r), settings) for r in range(2)]
    for engine in engines:
        engine.start()
    results: list[bool] = []
    threads = [threading.Thread(target=lambda e=engine: results.append(e.shutdown(timeout=TIMEOUT)))
               for engine in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert results == [True, True]


def test_a_collective_abandoned_in_the_transport_fails_quietly(job2: Job, caplog, monkeypatch) -> None:
    """An abandoned wait (the process gave the job up: an elastic epoch ended) fails the call's handle
    with its cause and logs no error: the survivor's log carried a traceback after the next epoch began."""
    from unison.backends.base import Abandoned
    from unison.errors import HorovodInternalError

    def abandoned(*args: object, **kwargs: object) -> None:
        raise Abandoned()

    for engine in job2.engines:
        monkeypatch.setattr(engine.backend, "allreduce_", abandoned)
    caplog.set_level("DEBUG", logger="unison.engine.actions")

    def work(rank: int, engine: Engine) -> BaseException | None:
        entry = allreduce_entry("gone", rank, np.ones(4, np.float32))
        engine.enqueue([entry])
        assert entry.handle.wait(TIMEOUT)
        return entry.handle.error

    errors = job2.run_ranks(work)
    assert all(isinstance(e, HorovodInternalError) and isinstance(e.__cause__, Abandoned) for e in errors), errors
    records = [r for r in caplog.records if r.name == "unison.engine.actions"]
    assert records and all(r.levelname == "DEBUG" and "abandoned" in r.getMessage() for r in records), records
