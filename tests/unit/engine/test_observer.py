"""Observers of the engine's cycles (the fan-out, the timeline as one), and rank 0's stall feed."""

from __future__ import annotations

import json

import pytest

from unison.dtypes import DType
from unison.engine.observer import SILENT, CycleObserver, Observers, Silent, observe_all
from unison.engine.stall_feed import PERIOD_SECONDS, StallFeed
from unison.engine.timeline import Timeline
from unison.ops import Kind
from unison.protocol.cache import ResponseCache
from unison.protocol.cycle import FLAG_BLOCKED, Summary, encode_status_row, read_votes, summary_of, words_for
from unison.protocol.messages import Request, Response
from unison.protocol.negotiation import Coordinator
from unison.protocol.stall import StallInspector


class Recorder(Silent):
    def __init__(self, log: list[str], label: str) -> None:
        self.log, self.label = log, label

    def cycle_started(self, now: float) -> None:
        self.log.append(f"{self.label}:cycle")

    def executed(self, response: Response) -> None:
        self.log.append(f"{self.label}:executed")

    def close(self) -> None:
        self.log.append(f"{self.label}:close")
        raise OSError(self.label)


def test_observe_all_keeps_the_present_ones_in_order() -> None:
    log: list[str] = []
    a, b = Recorder(log, "a"), Recorder(log, "b")
    assert observe_all() is SILENT and observe_all(None) is SILENT
    assert observe_all(None, a) is a
    both = observe_all(a, None, b)
    assert isinstance(both, Observers) and both.observers == (a, b)
    both.cycle_started(0.0)
    both.executed(Response(Kind.BARRIER, ()))
    with pytest.raises(OSError, match="a"):  # every observer is closed, the first error is raised
        both.close()
    assert log == ["a:cycle", "b:cycle", "a:executed", "b:executed", "a:close", "b:close"]


def test_the_implementations_satisfy_the_protocol(tmp_path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"))
    observers: list[CycleObserver] = [SILENT, timeline, Observers([SILENT])]
    assert all(callable(o.executed) and callable(o.negotiated) for o in observers)
    timeline.close()


def _votes(size: int, cache: ResponseCache, blocked: frozenset[int] = frozenset()):  # type: ignore[no-untyped-def]
    words = words_for(cache.num_slots)
    matrix = [encode_status_row(joined=False, news=False, payload_bytes=0, hits=0, invalid=0, words=words,
                                blocked=rank in blocked) for rank in range(size)]
    return read_votes(matrix, words), matrix


def test_the_stall_feed_checks_once_a_period_and_stops_the_job_through_its_callback() -> None:
    coordinator = Coordinator(2, {0: (0, 1)})
    request = Request("allreduce.late", Kind.ALLREDUCE, 0, DType.FLOAT32, (1,))
    assert coordinator.handle([[request], []], 0.0) == []
    stops: list[str] = []
    cache = ResponseCache(4)
    feed = StallFeed(StallInspector(check_seconds=1.0, shutdown_seconds=2.0), coordinator, cache,
                     {0: (0, 1)}, stop=stops.append)
    votes, matrix = _votes(2, cache)
    summary = summary_of(matrix, words_for(cache.num_slots))
    feed.voted(PERIOD_SECONDS, summary, votes, matrix)  # seen; not late yet
    feed.voted(PERIOD_SECONDS + 0.5, summary, votes, matrix)  # within the period: not checked
    assert stops == []
    feed.voted(10.0, summary, votes, matrix)
    assert len(stops) == 1 and "allreduce.late" in stops[0] and "1" in stops[0]


def test_the_timeline_records_a_cycle_it_observes(tmp_path) -> None:
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), mark_cycles=True)
    request = Request("allreduce.w", Kind.ALLREDUCE, 0, DType.FLOAT32, (2,))
    response = Response(Kind.ALLREDUCE, ("allreduce.w",), DType.FLOAT32, ((2,),))
    timeline.cycle_started(0.0)
    timeline.negotiated([[request], []], [])
    timeline.negotiated([[], [request]], [response])  # a second cycle: one span, two rank marks
    timeline.negotiated([[Request("shutdown", Kind.SHUTDOWN, 0)]], [])  # never on the timeline
    timeline.executing(response)
    timeline.executed(response)
    timeline.close()
    events = json.loads(path.read_text())
    named = [(e["ph"], e.get("name")) for e in events if e.get("pid") == 1 and e["ph"] != "M"]
    assert named == [("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("X", "1"), ("E", None),
                     ("B", "ALLREDUCE"), ("E", None)]
    assert events[-1]["args"] == {"dtype": "float32", "shape": "[2]"}
    assert any(e.get("name") == "CYCLE_START" for e in events)
    assert not any(e.get("args", {}).get("name") == "shutdown" for e in events)


def test_a_rank_that_sent_as_a_request_what_others_wait_for_in_the_cache_counts_as_submitted() -> None:
    # rank 1's cache entry was invalid, so it sent the tensor to the coordinator; rank 0 voted its
    # cached slot. Both submitted: neither view alone may make rank 1 "not submitted" (a false deadlock).
    coordinator = Coordinator(2, {0: (0, 1)})
    request = Request("allreduce.x", Kind.ALLREDUCE, 0, DType.FLOAT32, (1,))
    assert coordinator.handle([[], [request]], 0.0) == []
    cache = ResponseCache(4)
    slot = cache.put(Response(Kind.ALLREDUCE, ("allreduce.x",), DType.FLOAT32, ((1,),)))
    words = words_for(cache.num_slots)
    matrix = [encode_status_row(joined=False, news=False, payload_bytes=0, hits=(1 << slot) if rank == 0 else 0,
                                invalid=0, words=words, blocked=True) for rank in range(2)]
    votes = read_votes(matrix, words)
    stops: list[str] = []
    feed = StallFeed(StallInspector(check_seconds=1.0, shutdown_seconds=100.0, deadlock_seconds=1.0), coordinator,
                     cache, {0: (0, 1)}, stop=stops.append)
    for now in (1.0, 3.0, 5.0, 7.0):
        feed.voted(now, summary_of(matrix, words), votes, matrix)
    assert stops == []


def test_without_rows_the_feed_checks_the_coordinator_alone_or_asks_for_rows() -> None:
    # A summary with no rank waiting in the cache and none blocked: the coordinator's table is all
    # there is, so the feed checks without rows. A summary that shows a cached wait or a blocked rank:
    # the feed asks for every rank's row in the next cycle and checks nothing yet.
    coordinator = Coordinator(2, {0: (0, 1)})
    request = Request("allreduce.late", Kind.ALLREDUCE, 0, DType.FLOAT32, (1,))
    assert coordinator.handle([[request], []], 0.0) == []
    stops: list[str] = []
    feed = StallFeed(StallInspector(check_seconds=1.0, shutdown_seconds=2.0), coordinator, ResponseCache(4),
                     {0: (0, 1)}, stop=stops.append)
    quiet = Summary(0, 0, 0, 0)
    assert feed.voted(PERIOD_SECONDS, quiet, None, None) is False
    assert not feed.due(PERIOD_SECONDS + 0.5) and feed.due(2 * PERIOD_SECONDS)
    assert feed.voted(10.0, Summary(FLAG_BLOCKED, 0, 0, 0), None, None) is True  # rows wanted, no check
    assert feed.voted(10.0, Summary(0, 0, 0, 0b1), None, None) is True
    assert stops == []
    assert feed.voted(10.0, quiet, None, None) is False
    assert len(stops) == 1 and "allreduce.late" in stops[0]
