"""The abort's protocol step, without MPI: a shutdown request with a reason aborts every rank."""

from __future__ import annotations

from unison._job.failure import describe
from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol.messages import Request, ResponseKind, decode_requests, encode_requests
from unison.protocol.negotiation import Coordinator


def test_a_shutdown_with_a_reason_becomes_one_abort_carrying_the_lowest_ranks_reason() -> None:
    coordinator = Coordinator(3)
    grad = Request("g", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (2,))
    lists = [[grad], [Request("shutdown", CollectiveKind.SHUTDOWN, 1, reason="rank 1 failed: boom")],
             [Request("shutdown", CollectiveKind.SHUTDOWN, 2, reason="rank 2 failed: bang")]]
    responses = coordinator.handle(lists, now=0.0)
    assert [(r.kind, r.message) for r in responses] == [(ResponseKind.ABORT, "rank 1 failed: boom")]


def test_an_orderly_shutdown_is_not_an_abort() -> None:
    responses = Coordinator(2).handle([[Request("shutdown", CollectiveKind.SHUTDOWN, 0)], []], now=0.0)
    assert [r.kind for r in responses] == [CollectiveKind.SHUTDOWN.value]


def test_the_reason_survives_the_wire() -> None:
    request = Request("shutdown", CollectiveKind.SHUTDOWN, 3, reason="rank 3 (h, pid 1) failed: E: x")
    assert decode_requests(encode_requests([request]), 3) == [request]


def test_describe_names_rank_host_pid_exception_and_place() -> None:
    def fail() -> None:
        raise ValueError("bad value\nsecond line")

    try:
        fail()
    except ValueError as exc:
        text = describe(exc, 3, "gpu07", 1234)
    assert text.startswith("rank 3 (gpu07, pid 1234) failed: ValueError: bad value at test_abort_protocol.py:")
    assert "in fail <- test_abort_protocol.py:" in text and "second line" not in text
