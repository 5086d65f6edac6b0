"""The flight record's ring, the detail cycle's gather of every rank's place, and the record's file."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np

from unison.dtypes import DType
from unison.engine import flight
from unison.engine.flight import DONE, FlightRecord
from unison.engine.status import StatusExchange
from unison.ops import CollectiveKind, Kind
from unison.protocol.cycle import FLAG_DETAIL, FLAG_PAYLOAD
from unison.protocol.messages import Request, Response
from unison.protocol.places import ROW_BYTES, Place, encode_place, read_place


def request(name: str) -> Request:
    return Request(name, CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (4,), site="t.py:1 in f")


def test_records_wait_until_their_response_runs_and_the_ring_keeps_the_newest() -> None:
    record = FlightRecord(capacity=3)
    for name in ("a", "b", "c"):
        record.submitted(request(name), 1.0)
    record.finished(Response(Kind.ALLREDUCE, ("a", "b")), 2.0)  # fused
    record.finished(Response(Kind.ERROR, ("c",)), 3.0, failed=True)
    record.append((request("d"), 4.0, 4.0, DONE))  # the steady state's
    entries = record.snapshot(wall_offset=100.0)
    assert [(e["name"], e["state"], e["finished"]) for e in entries] == [
        ("b", "done", 102.0), ("c", "failed", 103.0), ("d", "done", 104.0)]
    assert entries[0] == {"name": "b", "kind": "allreduce", "shape": [4], "dtype": "float32", "set": 0,
                          "state": "done", "taken": 101.0, "finished": 102.0, "site": "t.py:1 in f"}


def test_a_record_of_no_capacity_keeps_nothing_and_resizing_keeps_the_newest() -> None:
    empty = FlightRecord(capacity=0)
    empty.submitted(request("a"), 1.0)
    empty.append((request("b"), 1.0, 1.0, DONE))
    assert len(empty) == 0 and empty.capacity == 0
    record = FlightRecord(capacity=4)
    for name in "abcd":
        record.append((request(name), 1.0, 1.0, DONE))
    record.resize(2)
    record.append((request("e"), 1.0, 1.0, DONE))
    assert [e["name"] for e in record.snapshot(0.0)] == ["d", "e"]


class Backend:
    """Two ranks' status exchange seen from rank 0: the other rank's vector and rows are fixed here."""

    rank, size, reduces_status = 0, 2, True

    def __init__(self, other_vector: list[int], other_place: bytes) -> None:
        self.other_vector, self.other_place = other_vector, other_place
        self.gathered: list[int] = []

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        return vector & np.array(self.other_vector, dtype=np.uint64)

    def gather_status(self, row: np.ndarray) -> np.ndarray:
        self.gathered.append(row.size)
        other = (np.frombuffer(self.other_place, dtype=np.uint64) if row.size * 8 == ROW_BYTES
                 else np.zeros(row.size, dtype=np.uint64))
        return np.stack([row, other])


def exchange(detail: bool, other_place: bytes = encode_place(Place("o.py:2 in g"))) -> tuple[StatusExchange, Backend]:
    from unison.protocol.cycle import encode_summary

    other = encode_summary(joined=False, news=False, blocked=False, detail=False, payload=True, hits=0, own=0,
                           invalid=0, words=1)
    backend = Backend(other, other_place)
    status = StatusExchange(backend)  # type: ignore[arg-type]
    status.where_of = lambda: encode_place(Place("me.py:1 in f", "allreduce.x"))
    summary, matrix = status.exchange(joined=False, news=False, blocked=False, detail=detail, payload_bytes=0,
                                      hits=0, own=0, invalid=0, words=1)
    assert summary.flags & FLAG_PAYLOAD and matrix is not None
    return status, backend


def test_only_a_detail_cycle_gathers_every_rank_s_place() -> None:
    status, backend = exchange(detail=False)
    assert backend.gathered == [4] and status.take_places() is None and status.places_gathered == 0
    status, backend = exchange(detail=True)
    assert backend.gathered == [4, ROW_BYTES // 8] and status.places_gathered == 1
    places = status.take_places()
    assert places is not None and [read_place(row) for row in places] == [
        Place("me.py:1 in f", "allreduce.x"), Place("o.py:2 in g")]
    assert status.take_places() is None  # taken once


class RowsBackend(Backend):
    """A control plane that gathers every rank's row to every rank each cycle (the gRPC service's)."""

    reduces_status = False

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        return np.stack([row, np.zeros(row.size, dtype=np.uint64)])


def test_where_rows_go_everywhere_each_cycle_rank_0_s_row_asks_for_the_places() -> None:
    for detail in (False, True):
        backend = RowsBackend([], encode_place(Place("o.py:2 in g")))
        status = StatusExchange(backend)  # type: ignore[arg-type]
        _, matrix = status.exchange(joined=False, news=False, blocked=False, detail=detail, payload_bytes=0,
                                    hits=0, own=0, invalid=0, words=1)
        assert matrix is not None and bool(matrix[0][0] & FLAG_DETAIL) is detail
        assert (status.take_places() is not None) is detail and backend.gathered == ([ROW_BYTES // 8] if detail else [])


def test_a_record_file_holds_the_ring_and_names_the_stop(tmp_path: Path) -> None:
    from unison._job.flight_file import FORMAT, default_directory, write_record

    class Engine:
        def __init__(self) -> None:
            self._cycles = type("Cycles", (), {"flight": FlightRecord(2)})()

    engine = Engine()
    engine._cycles.flight.append((request("a"), 1.0, 1.0, DONE))
    path = write_record(engine, tmp_path / "records", 1, 2, "h", "Deadlock: every rank ...\n  rank 0 waits")  # type: ignore[arg-type]
    assert path == tmp_path / "records" / "flight-1.json" and (path.parent.stat().st_mode & 0o777) == 0o700
    data = json.loads(path.read_text())
    assert (data["format"], data["rank"], data["size"], data["reason"]) == (FORMAT, 1, 2, "Deadlock: every rank ...")
    assert [entry["name"] for entry in data["entries"]] == ["a"]
    assert default_directory("/x", None) == Path("/x") and default_directory("", tmp_path) == tmp_path
    assert default_directory("", None).parent.name.startswith("unison-flight-")


def test_the_examples_hold() -> None:
    assert doctest.testmod(flight).failed == 0


def test_the_settings_of_the_record_and_the_reports() -> None:
    import pytest

    from unison.config import load_settings
    from unison.errors import ConfigError

    settings = load_settings({"UNISON_FLIGHT_RECORDS": "50", "UNISON_FLIGHT_DIR": "/r", "UNISON_STALL_STACKS": "1"})
    assert (settings.flight_records, settings.flight_dir, settings.stall_stacks) == (50, "/r", True)
    assert load_settings({}).flight_records == flight.DEFAULT_CAPACITY
    with pytest.raises(ConfigError, match=r"UNISON_FLIGHT_RECORDS must be a non-negative integer\. Got "
                                          r"UNISON_FLIGHT_RECORDS='-1'\."):
        load_settings({"UNISON_FLIGHT_RECORDS": "-1"})
