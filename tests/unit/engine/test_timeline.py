"""Tests of the Chrome-trace timeline writer (unison.engine.timeline)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from unison.engine.timeline import FLUSH_SECONDS, Timeline
from unison.errors import ConfigError


class FakeClock:
    """A clock the test moves by hand; every reading advances it by `step` seconds."""

    def __init__(self, step: float = 1e-6) -> None:
        self.now = 100.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def read_events(path: str) -> list[dict[str, Any]]:
    """Parse the timeline whether or not it has been closed (an open one lacks the final ``]``)."""
    text = Path(path).read_text(encoding="utf-8").rstrip()
    if not text.endswith("]"):
        text += "]"
    events = json.loads(text)
    assert isinstance(events, list)
    return events


def run_one_tensor(timeline: Timeline, name: str = "allreduce.test_allreduce") -> None:
    timeline.mark_cycle()
    timeline.negotiate_start(name, "allreduce")
    timeline.negotiate_rank_ready(name, 0)
    timeline.negotiate_rank_ready(name, 1)
    timeline.negotiate_end(name)
    timeline.start(name, "allreduce")
    timeline.activity_start(name, "MEMCPY_IN_FUSION_BUFFER")
    timeline.activity_end(name)
    timeline.activity_start(name, "MPI_ALLREDUCE")
    timeline.activity_end(name)
    timeline.end(name, "float32", (3, 4))


def pid_of(events: list[dict[str, Any]], name: str) -> int:
    [pid] = [e["pid"] for e in events if e.get("name") == "process_name" and e["args"].get("name") == name]
    return int(pid)


def assert_balanced(events: list[dict[str, Any]]) -> None:
    depth: dict[int, int] = {}
    for event in events:
        if event["ph"] == "B":
            depth[event["pid"]] = depth.get(event["pid"], 0) + 1
        elif event["ph"] == "E":
            depth[event["pid"]] = depth.get(event["pid"], 0) - 1
            assert depth[event["pid"]] >= 0, f"E without a B on pid {event['pid']}"
    assert all(d == 0 for d in depth.values()), depth


def test_negotiated_and_executed_tensor(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "timeline.json"), mark_cycles=True, clock=FakeClock())
    run_one_tensor(timeline)
    timeline.close()

    text = (tmp_path / "timeline.json").read_text()
    for substring in ("allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"):
        assert substring in text
    events = json.loads(text)
    assert events[0]["pid"] == 0 and "start_time_since_epoch_in_micros" in events[0]["args"]
    pid = pid_of(events, "allreduce.test_allreduce")
    assert pid > 0
    assert {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}} in events
    mine = [(e["ph"], e.get("name")) for e in events if e.get("pid") == pid and e["ph"] != "M"]
    assert mine == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("X", "1"), ("E", None),
        ("B", "ALLREDUCE"),
        ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", None),
        ("B", "MPI_ALLREDUCE"), ("E", None),
        ("E", None),
    ]
    last = [e for e in events if e.get("pid") == pid][-1]
    assert last["args"] == {"dtype": "float32", "shape": "[3, 4]"}
    [ready] = [e for e in events if e.get("pid") == pid and e["ph"] == "X" and e["name"] == "0"]
    assert ready["dur"] == 0
    [cycle] = [e for e in events if e.get("name") == "CYCLE_START"]
    assert cycle["ph"] == "i" and cycle["s"] == "g"
    assert_balanced(events)


def test_every_tensor_is_its_own_process(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"))
    names = ["allreduce.a", "broadcast.b", 'odd "name" \\ ü']
    for name in names:
        timeline.start(name, "broadcast")
        timeline.end(name, "int64", ())
    timeline.start(names[0], "allreduce")  # seen before: no new process
    timeline.end(names[0], "int64", (2,))
    timeline.close()
    events = read_events(timeline.path)
    pids = [pid_of(events, name) for name in names]
    assert len(set(pids)) == 3 and 0 not in pids
    assert timeline.statistics().tensors_seen == 3
    assert [e["args"]["shape"] for e in events if e["ph"] == "E"] == ["[]", "[]", "[]", "[2]"]


def test_no_cycle_marks_unless_asked(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"), mark_cycles=False)
    run_one_tensor(timeline)
    timeline.close()
    assert "CYCLE_START" not in (tmp_path / "t.json").read_text()


def test_events_stay_balanced_when_the_engine_repeats_or_skips_calls(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"), clock=FakeClock())
    name = "allreduce.x"
    timeline.negotiate_start(name, "allreduce")
    timeline.negotiate_start(name, "allreduce")  # a later cycle's cache miss: ignored
    timeline.negotiate_end(name)
    timeline.negotiate_end(name)  # nothing open: ignored
    timeline.start(name, "allreduce")
    timeline.activity_start(name, "MEMCPY_IN_FUSION_BUFFER")
    timeline.activity_start(name, "MPI_ALLREDUCE")  # closes the previous activity first
    timeline.end(name, "float32", (1,))  # closes the open activity too
    timeline.activity_end(name)  # nothing open: ignored
    timeline.end(name, "float32", (1,))  # nothing open: ignored
    timeline.activity_start("allreduce.y", "MPI_ALLREDUCE")  # outside an execution span: ignored
    timeline.close()
    events = read_events(timeline.path)
    assert_balanced(events)
    assert sum(1 for e in events if e.get("name") == "NEGOTIATE_ALLREDUCE") == 1
    assert sum(1 for e in events if e["ph"] == "E") == 4


def test_timestamps_are_integer_microseconds_and_non_decreasing(tmp_path: Path) -> None:
    clock = FakeClock(step=0.25e-3)
    timeline = Timeline(str(tmp_path / "t.json"), mark_cycles=True, clock=clock)
    run_one_tensor(timeline, "allreduce.a")
    clock.now -= 1.0  # a clock that steps back must not produce decreasing timestamps
    run_one_tensor(timeline, "allreduce.b")
    timeline.close()
    stamps = [e["ts"] for e in read_events(timeline.path) if "ts" in e]
    assert all(isinstance(ts, int) for ts in stamps)
    assert stamps == sorted(stamps)
    assert abs(stamps[0] - 250) <= 1 and stamps[-1] > stamps[0]


def wait_for_text(path: Path, text: str, seconds: float = 10.0) -> str:
    """The file's content once it holds `text` (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    content = path.read_text(encoding="utf-8")
    while text not in content and time.monotonic() < deadline:
        time.sleep(FLUSH_SECONDS / 5)
        content = path.read_text(encoding="utf-8")
    return content


def test_file_is_loadable_while_running_and_after_close(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"), mark_cycles=True, clock=FakeClock())
    assert read_events(timeline.path)[0]["args"]["start_time_since_epoch_in_micros"] > 0

    run_one_tensor(timeline, "allreduce.early")
    wait_for_text(tmp_path / "t.json", '"MPI_ALLREDUCE"')  # the writer thread wrote it out
    mid_run = read_events(timeline.path)
    assert (tmp_path / "t.json").read_text().rstrip()[-1] != "]"
    assert any(e.get("args", {}).get("name") == "allreduce.early" for e in mid_run)

    timeline.negotiate_start("allreduce.late", "allreduce")
    timeline.close()
    with open(timeline.path, encoding="utf-8") as f:
        events = json.load(f)
    assert any(e.get("args", {}).get("name") == "allreduce.late" for e in events)


@pytest.mark.parametrize("mark_cycles", [True, False])
def test_events_reach_the_file_with_no_further_call(tmp_path: Path, mark_cycles: bool) -> None:
    # A live run can be watched: what the engine recorded is written out by the writer thread every
    # FLUSH_SECONDS, also when the engine records nothing more (idle, or blocked in a long step).
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), mark_cycles=mark_cycles, clock=FakeClock())
    timeline.mark_cycle()
    timeline.negotiate_start("allreduce.live", "allreduce")
    timeline.negotiate_rank_ready("allreduce.live", 0)
    timeline.negotiate_end("allreduce.live")
    timeline.start("allreduce.live", "allreduce")  # then nothing: the engine waits in the reduction
    content = wait_for_text(path, '"name":"ALLREDUCE"')
    events = read_events(str(path))
    names = [e.get("name") for e in events]
    assert "NEGOTIATE_ALLREDUCE" in names and "ALLREDUCE" in names, content
    assert ("CYCLE_START" in names) is mark_cycles
    assert any(e.get("args", {}).get("name") == "allreduce.live" for e in events)
    assert timeline.statistics().events_buffered == 0 and timeline.statistics().flushes >= 1
    timeline.end("allreduce.live", "float32", (2,))
    timeline.flush()  # flush() writes at once, from any thread
    assert '"shape":"[2]"' in path.read_text(encoding="utf-8")
    timeline.close()
    assert_balanced(json.loads(path.read_text(encoding="utf-8")))


def test_close_is_idempotent_and_later_events_are_dropped(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"))
    run_one_tensor(timeline)
    timeline.close()
    content = (tmp_path / "t.json").read_text()
    written = timeline.statistics().events_written
    timeline.close()
    run_one_tensor(timeline)
    timeline.flush()
    timeline.close()
    assert (tmp_path / "t.json").read_text() == content
    assert timeline.state == "closed"
    stats = timeline.statistics()
    assert stats.events_written == written and stats.events_dropped > 0
    assert "closed" in repr(timeline)


def test_close_from_another_thread_leaves_valid_json(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"), mark_cycles=True)
    stop = threading.Event()

    def engine() -> None:
        i = 0
        while not stop.is_set():
            run_one_tensor(timeline, f"allreduce.{i % 50}")
            i += 1

    thread = threading.Thread(target=engine)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while timeline.statistics().flushes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        timeline.close()
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    with open(timeline.path, encoding="utf-8") as f:
        events = json.load(f)
    assert len(events) > 10


def test_statistics_count_events_tensors_and_bytes(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path / "t.json"), mark_cycles=True)
    run_one_tensor(timeline, "allreduce.a")
    run_one_tensor(timeline, "allreduce.b")
    assert timeline.statistics().events_written + timeline.statistics().events_buffered == 2 * 12
    timeline.close()
    stats = timeline.statistics()
    assert stats.tensors_seen == 2
    assert stats.events_written == 2 * 12  # per tensor: metadata, cycle mark, 10 events
    assert stats.events_buffered == 0 and stats.events_dropped == 0
    assert stats.bytes_written == os.path.getsize(timeline.path)
    assert stats.flushes >= 1
    assert "closed" in repr(timeline) and "t.json" in repr(timeline)


@pytest.mark.parametrize("where", ["missing-dir/t.json", "."])
def test_bad_path_raises_config_error_naming_it(tmp_path: Path, where: str) -> None:
    path = str(tmp_path / where)
    with pytest.raises(ConfigError, match=r"The timeline file '.*' cannot be opened for writing") as info:
        Timeline(path)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_unwritable_file_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="'/dev/full' cannot be written"):
        Timeline("/dev/full")


def test_a_write_error_stops_the_timeline_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real write error: the timeline writes into a pipe whose reader then goes away (EPIPE).
    fifo = str(tmp_path / "t.fifo")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    timeline = Timeline(fifo)
    os.close(reader)
    with caplog.at_level(logging.ERROR, logger="unison.engine.timeline"):
        run_one_tensor(timeline)
        timeline.flush()
        timeline.flush()
    assert timeline.state == "failed"
    assert timeline.statistics().events_dropped > 0
    assert len(caplog.records) == 1 and "Broken pipe" in caplog.records[0].getMessage()
    timeline.close()
    assert timeline.state == "failed"


def test_the_cost_benchmark_runs(tmp_path: Path) -> None:
    # benchmarks/timeline.py (not a timing test): its quick mode runs both sides and prints medians.
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "timeline.py"), "events", "--quick",
                           "--baseline", str(root / "unison" / "engine" / "timeline.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"calls_wall_us", "calls_thread_cpu_us", "process_cpu_us"} <= result["current"].keys()
    assert result["baseline"].keys() == result["current"].keys()
