"""Each rank's place as rank 0 reads it, and the stall and deadlock reports that name it."""

from __future__ import annotations

import doctest
import json

from unison.protocol import places
from unison.protocol.places import ROW_BYTES, Place, encode_place, origin_of, read_place
from unison.protocol.stall import StallInspector

PENDING = {"allreduce.x": (frozenset({0, 2}), frozenset({0, 1, 2}))}


def test_a_place_makes_a_row_of_fixed_size_and_reads_back() -> None:
    place = Place("t.py:4 in step <- t.py:9 in main", "allreduce.x", "t.py:4 in step (DDP bucket 0)",
                  ("t.py:4 in step", "t.py:9 in main"), wait_number=41)
    row = encode_place(place)
    assert len(row) == ROW_BYTES and read_place(row) == place


def test_a_row_without_a_wait_number_reads_as_unknown_and_a_wrong_one_as_garbage() -> None:
    read = read_place(json.dumps({"at": "t.py:1 in f"}).encode())
    assert read is not None and read.wait_number == -1
    for wrong in ("3", 2.0, None, True):
        assert read_place(json.dumps({"at": "t.py:1 in f", "wait_number": wrong}).encode()) is None


def test_a_place_is_named_by_the_main_thread_s_frames_with_its_collective_s_origin() -> None:
    # The site is where the call was first made with these arguments: the same call made from another
    # line (a reused request) is named where the main thread is now.
    assert Place("t.py:46 in main", "allreduce.x", "t.py:18 in main").where == "t.py:46 in main"
    assert Place("t.py:7 in step", "allreduce.x", "t.py:3 in step (DDP bucket 0)").where == \
        "t.py:7 in step (DDP bucket 0)"
    assert Place("", "allreduce.x", "t.py:3 in step").where == "t.py:3 in step"


def test_a_stack_too_long_for_the_row_loses_its_outer_frames_first() -> None:
    stack = tuple(f"deep_module_with_a_long_name.py:{n} in function_number_{n}" for n in range(200))
    read = read_place(encode_place(Place("t.py:1 in f", stack=stack)))
    assert read is not None and read.at == "t.py:1 in f"
    assert 0 < len(read.stack) < 200 and read.stack == stack[:len(read.stack)]


def test_garbage_is_no_place() -> None:
    assert read_place(b"\0" * ROW_BYTES) is None
    assert read_place(b"\xff\xfe" + b"\0" * 10) is None
    assert read_place(json.dumps([1, 2]).encode()) is None
    assert read_place(json.dumps({"at": 3}).encode()) is None
    assert read_place(json.dumps({"at": "a", "stack": [1]}).encode()) is None


def test_a_site_s_origin() -> None:
    assert origin_of("a.py:1 in f (FSDP's all-gather of module 'l.0')") == "FSDP's all-gather of module 'l.0'"
    assert origin_of("a.py:1 in <module>") == ""


def stall_report(places: dict[int, Place], sites: dict[str, str] | None = None, stacks: bool = False) -> str:
    inspector = StallInspector(check_seconds=1.0, shutdown_seconds=0.0)
    inspector.show_stacks = stacks
    assert inspector.observe(0.0, PENDING, places=places, sites=sites) is None
    report = inspector.observe(1.0, PENDING, blocked=frozenset({0}), places=places, sites=sites)
    assert report is not None
    return report.text


def test_a_stall_names_where_the_missing_rank_is_and_groups_the_submitters_by_place() -> None:
    text = stall_report({0: Place("t.py:7 in main", "allreduce.x", "t.py:7 in main (DDP bucket 0)"),
                         1: Place("t.py:3 in evaluate"), 2: Place("t.py:7 in main", "allreduce.x",
                                                                    "t.py:7 in main (DDP bucket 0)")},
                        {"allreduce.x": "t.py:7 in main (DDP bucket 0)"})
    lines = text.splitlines()
    assert lines[1] == ("  rank 1 has not submitted: allreduce.x (DDP bucket 0; waiting 1.0 s, submitted by ranks "
                        "[0, 2]); its main thread is at t.py:3 in evaluate")
    assert lines[2] == "  ranks [0, 2]: their main threads wait at t.py:7 in main (DDP bucket 0)"
    assert "innermost frame first" not in text


def test_ranks_that_did_not_say_are_named_without_a_place() -> None:
    lines = stall_report({}).splitlines()
    assert lines[1] == "  rank 1 has not submitted: allreduce.x (waiting 1.0 s, submitted by ranks [0, 2])"
    assert not lines[2].startswith("  rank")


def test_on_request_each_named_rank_s_stack_follows() -> None:
    text = stall_report({1: Place("t.py:3 in evaluate", stack=("t.py:3 in evaluate", "t.py:9 in main"))},
                        stacks=True)
    assert "  rank 1's main thread, innermost frame first:\n    t.py:3 in evaluate\n    t.py:9 in main" in text


def test_a_deadlock_names_where_each_rank_waits() -> None:
    inspector = StallInspector(check_seconds=60.0, shutdown_seconds=600.0, deadlock_seconds=1.0)
    pending = {"allreduce.a": (frozenset({0}), frozenset({0, 1})), "allreduce.b": (frozenset({1}), frozenset({0, 1}))}
    where = {0: Place("t.py:5 in main", "allreduce.a"), 1: Place("t.py:8 in main", "allreduce.b")}
    assert inspector.observe(0.0, pending, frozenset({0, 1}), where) is None
    report = inspector.observe(1.0, pending, frozenset({0, 1}), where)
    assert report is not None and report.deadlock
    assert report.text.splitlines()[1:3] == [
        "  rank 0 waits for allreduce.a; has not submitted allreduce.b; its main thread waits at t.py:5 in main",
        "  rank 1 waits for allreduce.b; has not submitted allreduce.a; its main thread waits at t.py:8 in main"]


def test_the_examples_hold() -> None:
    assert doctest.testmod(places).failed == 0
