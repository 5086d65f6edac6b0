"""The start-up check's messages (unison/_job/startup.py): every report and verdict fits the buffer it is received
into, whatever the text, so every rank raises `StartupError` with the reason.

`check_start` runs here over a stand-in for MPI's point-to-point calls that, like MPI, fails a receive
whose message is longer than its buffer: rank 0's side first, then rank 1's with what rank 0 sent.
"""

from __future__ import annotations

import doctest
import json
import os
from typing import Any

import numpy as np
import pytest

from unison._job import startup as _startup
from unison._job.startup import REPORT_BYTES, check_start, verdict, verdict_message
from unison.errors import StartupError


class _Status:
    count = 0

    def Get_count(self) -> int:  # noqa: N802  (mpi4py's name)
        return self.count


class _Mpi:
    BYTE = None
    Status = _Status


class _Request:
    def __init__(self, message: bytes | None = None, buffer: np.ndarray | None = None) -> None:
        self.message, self.buffer = message, buffer

    def Test(self, status: _Status | None = None) -> bool:  # noqa: N802
        if self.buffer is None:  # a send: done
            return True
        if self.message is None:  # nobody sends: the rank is missing
            return False
        if len(self.message) > len(self.buffer):
            raise RuntimeError("MPI_ERR_TRUNCATE: Message truncated")
        self.buffer[: len(self.message)] = np.frombuffer(self.message, dtype=np.uint8)
        if status is not None:
            status.count = len(self.message)
        return True

    def Wait(self) -> None:  # noqa: N802
        pass


class _Comm:
    """One rank's end: `incoming` is what each source sends it; what it sends lands in `sent`."""

    def __init__(self, rank: int, size: int, incoming: dict[int, bytes]) -> None:
        self.rank, self.size, self.incoming = rank, size, incoming
        self.sent: dict[int, bytes] = {}

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Isend(self, spec: list[Any], dest: int, tag: int) -> _Request:  # noqa: N802
        self.sent[dest] = bytes(spec[0])
        return _Request()

    def Irecv(self, spec: list[Any], source: int, tag: int) -> _Request:  # noqa: N802
        return _Request(self.incoming.get(source), spec[0])


def _rank_zero(problem: str, reports: dict[int, bytes], size: int) -> tuple[StartupError, bytes]:
    comm = _Comm(0, size, reports)
    with pytest.raises(StartupError) as raised:
        check_start(comm, _Mpi, problem, timeout_seconds=0.05)
    return raised.value, comm.sent[1]


def _rank_one(problem: str, verdict_bytes: bytes, size: int) -> tuple[StartupError, bytes]:
    comm = _Comm(1, size, {0: verdict_bytes})
    with pytest.raises(StartupError) as raised:
        check_start(comm, _Mpi, problem, timeout_seconds=0.05)
    return raised.value, comm.sent[0]


def test_examples_in_docstrings() -> None:
    result = doctest.testmod(_startup)
    assert result.failed == 0 and result.attempted > 0


def test_a_long_non_ascii_error_of_rank_zero_reaches_the_other_ranks() -> None:
    problem = "cannot open the timeline file /data/" + "é" * 5000
    on_zero, sent = _rank_zero(problem, {1: b""}, 2)
    assert len(sent) <= 16384
    on_one, _ = _rank_one("", sent, 2)
    assert str(on_one) == str(on_zero) and on_one.missing_ranks == ()
    assert str(on_one).startswith("init() failed: rank 0 could not start: cannot open the timeline file /data/éé")
    # rank 0's own report is cut as every other rank's: to REPORT_BYTES of UTF-8
    assert len(str(on_one).split(": ", 2)[2].encode()) <= REPORT_BYTES + 3


def test_thousands_of_missing_ranks_still_fit_the_verdict() -> None:
    size = 5000
    on_zero, sent = _rank_zero("", {1: b""}, size)
    assert on_zero.missing_ranks == tuple(range(2, size))
    assert len(sent) <= 16384
    on_one, _ = _rank_one("", sent, size)
    assert str(on_one).startswith("init() failed: ranks [2, 3, 4, ")
    assert 0 < len(on_one.missing_ranks) < size - 2
    assert on_one.missing_ranks == tuple(range(2, 2 + len(on_one.missing_ranks)))


def test_the_verdict_speaks_of_one_missing_rank_or_of_several() -> None:
    assert verdict({0: "", 1: ""}, [2], 60.0, "B") == (
        "init() failed: rank 2 did not reach init() within 60 s (it raised or exited before init(), is stuck before "
        "it, or already left the job); check its output. B.")
    assert verdict({1: ""}, [0, 2], 10.0, "B") == (
        "init() failed: ranks [0, 2] did not reach init() within 10 s (each raised or exited before init(), is stuck "
        "before it, or already left the job); check their output. B.")
    assert verdict({0: "", 1: ""}, [], 60.0) == ""


def test_a_report_holding_a_lone_surrogate_is_sent() -> None:
    undecodable = "cannot write " + os.fsdecode(b"\xe9")
    _, report = _rank_one(undecodable, json.dumps({"text": "x", "missing": []}).encode(), 2)
    assert report == b"cannot write \\udce9"
    on_zero, _ = _rank_zero("", {1: report}, 2)
    assert str(on_zero) == "init() failed: rank 1 could not start: cannot write \\udce9."


@pytest.mark.parametrize("limit_bytes", [256, 1024, 16384])
def test_every_verdict_message_fits_and_parses(limit_bytes: int) -> None:
    for text in ("", "plain", "é" * 20000, "\U0001f600" * 9000, "a" * 40000, os.fsdecode(b"\xff") * 3000):
        for missing in ([], [3], list(range(1, 20000))):
            message = verdict_message(text, missing, limit_bytes)
            told = json.loads(message)
            assert len(message) <= limit_bytes, (text[:5], len(missing))
            assert text.startswith(told["text"].removesuffix("...")) and missing[: len(told["missing"])] == told["missing"]
    assert json.loads(verdict_message("short", [4, 5]))["text"] == "short"  # what fits goes whole
