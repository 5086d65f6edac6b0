"""The flight records read side by side, the records kept out of unisonrun's directory, a stack's answer read."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

from unison._job.flight_file import FORMAT
from unison.launcher import flight, stacks
from unison.launcher.flight import diverge, load, main, render
from unison.launcher.stacks import main_thread_frames
from unison.launcher.supervision import records
from unison.launcher.supervision.records import keep_records


def entry(name: str, state: str, finished: float | None, *, set_id: int = 0, shape: tuple[int, ...] = (4,),
          site: str = "") -> dict[str, Any]:
    return {"name": name, "kind": "allreduce", "shape": list(shape), "dtype": "float32", "set": set_id,
            "state": state, "taken": (finished or 10.0) - 0.5, "finished": finished, "site": site}


def record(rank: int, entries: list[dict[str, Any]], size: int = 3) -> dict[str, Any]:
    return {"format": FORMAT, "rank": rank, "size": size, "host": "h", "pid": 100 + rank, "written": 12.0,
            "reason": "Deadlock: every rank ...", "capacity": 1000, "entries": entries}


def test_what_ran_lines_up_from_the_last_back_and_each_rank_s_pending_calls_follow() -> None:
    ran = [entry(f"g.{i}", "done", 1.0 + i) for i in range(4)]
    records_ = {
        0: record(0, ran + [entry("g.4", "pending", None, site="t.py:9 in main")]),
        1: record(1, ran[2:] + [entry("noname.1", "pending", None, shape=(1,))]),  # a shorter ring
        2: record(2, ran + [entry("g.4", "pending", None, site="t.py:9 in main")]),
    }
    found = diverge(records_)
    assert [e["name"] for e in found.ran] == ["g.2", "g.3"]
    assert {rank: [e["name"] for e in tail] for rank, tail in found.tails.items()} == {
        0: ["g.4"], 1: ["noname.1"], 2: ["g.4"]}
    text = render(records_, last=1)
    assert text.splitlines()[0] == "flight records of ranks [0, 1, 2] (of 3), written 0.0 s apart; the job deadlocked"
    assert "the last 1 collectives every rank ran (oldest first):\n  g.3 [4] float32" in text
    assert "  ranks [0, 2]: g.4 [4] float32, pending 2.5 s, at t.py:9 in main" in text
    assert "  rank 1: noname.1 [1] float32, pending 2.5 s" in text


def test_a_process_set_s_collectives_are_left_out_of_the_line_up_and_a_missing_rank_is_named() -> None:
    records_ = {0: record(0, [entry("g.0", "done", 1.0), entry("s.0", "done", 2.0, set_id=1)]),
                2: record(2, [entry("g.0", "done", 1.0)])}
    assert [e["name"] for e in diverge(records_).ran] == ["g.0"]
    assert "no record from ranks [1]" in render(records_)


def test_files_of_another_kind_are_not_records(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "flight-0.json").write_text(json.dumps(record(0, [entry("g.0", "done", 1.0)], size=1)))
    (tmp_path / "flight-1.json").write_text("{not json")
    (tmp_path / "flight-2.json").write_text(json.dumps({"format": "something else", "rank": 2, "entries": []}))
    assert list(load(tmp_path)) == [0]
    assert main([str(tmp_path)]) == 0 and "flight records of ranks [0] (of 1)" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 2
    assert render({}).startswith("no flight records here")


def test_unisonrun_keeps_the_records_out_of_its_directory(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    assert keep_records(job) is None
    (job / "flight-0.json").write_text("{}")
    (job / "started-0").write_text("h 1")
    kept = keep_records(job, tmp_path / "out")
    assert kept == tmp_path / "out" and (kept / "flight-0.json").exists() and not (job / "flight-0.json").exists()
    assert (job / "started-0").exists()
    (job / "flight-1.json").write_text("{}")
    elsewhere = keep_records(job)
    assert elsewhere is not None and elsewhere.name.startswith("unisonrun-flight-") and \
        (elsewhere / "flight-1.json").exists()


def test_the_main_thread_s_frames_of_a_faulthandler_answer() -> None:
    answer = ('Thread 0x0000000000000aaa (most recent call first):\n  File "/x/helper.py", line 7 in run\n\n'
              'Current thread 0x0000000000000bbb (most recent call first):\n  File "/x/train.py", line 3 in step\n'
              '  File "/x/train.py", line 9 in <module>\n\nThread 0x0000000000000ccc (most recent call first):\n'
              '  File "/x/other.py", line 1 in f\n')
    assert main_thread_frames("main thread 0x0000000000000bbb", answer) == [
        ("/x/train.py", 3, "step"), ("/x/train.py", 9, "<module>")]
    assert main_thread_frames("garbage", answer) == []


def test_the_examples_hold() -> None:
    for module in (flight, stacks, records):
        assert doctest.testmod(module).failed == 0, module
