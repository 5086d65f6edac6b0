"""The network toolkit on a small service of its own: a method table registered and called, refusals
carried as statuses both ways, retries, cancellation, the gate, the port, the heartbeat loop.

One in-process gRPC server per test (milliseconds); the messages are the coordinator's, the service
is not: what is tested is the toolkit, not either of unison's services.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from unison.errors import ConfigError, ConflictError, NotDeclaredError, RequestError
from unison.rpc.endpoints import REFUSAL_WORKERS, open_channel, serve
from unison.rpc.gate import Gate
from unison.rpc.handlers import handlers
from unison.rpc.heartbeat import every
from unison.rpc.methods import Method, Reading, Refused, Service
from unison.rpc.security import TOKEN_KEY, token_matches, token_metadata
from unison.rpc.stub import Cancelled, Retry, Stub
from unison.service import coordinator_pb2 as pb

SECRET = "t" * 64
DEMO = Service(
    "unison.test.v1.Demo",
    (
        Method("Echo", pb.AbortRequest, pb.AbortRequest),  # one request, one reply
        Method("Count", pb.HeartbeatRequest, pb.HeartbeatReply, Reading.STREAM, streams_replies=True),
        Method("Join", pb.AbortRequest, pb.AbortRequest, Reading.ALL),  # frames read whole
        Method("Wait", pb.StatusRequest, pb.StatusReply),
    ),
    hint="run the same version.",
    refusals=((NotDeclaredError, grpc.StatusCode.NOT_FOUND), (RequestError, grpc.StatusCode.INVALID_ARGUMENT)),
)


class Demo:
    """The service's behaviours, and what its hooks saw."""

    def __init__(self) -> None:
        self.refused: list[tuple[str, str]] = []
        self.bytes_in = self.bytes_out = 0
        self.release = threading.Event()

    def echo(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortRequest:
        if request.reason == "missing":
            raise NotDeclaredError("'missing' is not declared")
        if request.reason == "conflict":
            raise ConflictError("declared differently")  # a RequestError: INVALID_ARGUMENT, the first match
        if request.reason == "refuse":
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "not now")
        return pb.AbortRequest(rank=request.rank + 1, reason=request.reason)

    def count(self, requests: Iterator[pb.HeartbeatRequest], context: grpc.ServicerContext) -> Iterator[pb.HeartbeatReply]:
        for request in requests:
            yield pb.HeartbeatReply(abort=str(request.cycles))

    def join(self, requests: list[pb.AbortRequest], context: grpc.ServicerContext) -> pb.AbortRequest:
        return pb.AbortRequest(rank=len(requests), reason="".join(r.reason for r in requests))

    def wait(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        self.release.wait(10)
        return pb.StatusReply(size=1)

    def hooks(self) -> dict[str, object]:
        def bytes_in(size: int) -> None:
            self.bytes_in += size

        def bytes_out(size: int) -> None:
            self.bytes_out += size

        return {"on_refused": lambda method, exc: self.refused.append((method, str(exc))), "on_bytes_in": bytes_in,
                "on_bytes_out": bytes_out}


@pytest.fixture
def demo() -> Iterator[tuple[Demo, str, Gate]]:
    behaviour = Demo()
    gate = Gate(SECRET, 4, service="the demo service", why="a test keeps one open")
    handler = handlers(DEMO, {"Echo": behaviour.echo, "Count": behaviour.count, "Join": behaviour.join,
                              "Wait": behaviour.wait}, **behaviour.hooks())  # type: ignore[arg-type]
    server, port = serve(gate, handler, "127.0.0.1:0", who="the demo service", thread_name_prefix="demo")
    yield behaviour, f"127.0.0.1:{port}", gate
    behaviour.release.set()
    server.stop(0)


def test_a_method_table_names_its_paths_and_the_status_of_each_refusal() -> None:
    assert DEMO.path("Count") == "/unison.test.v1.Demo/Count"
    assert (DEMO["Echo"].streams_requests, DEMO["Join"].streams_requests, DEMO["Count"].streams_replies) == (
        False, True, True)
    with pytest.raises(KeyError, match=r"unison.test.v1.Demo has no method 'Nope'; its methods: \['Echo', 'Count'"):
        DEMO.path("Nope")
    assert DEMO.status_of(Refused(grpc.StatusCode.ABORTED, "x")) == grpc.StatusCode.ABORTED
    assert DEMO.status_of(NotDeclaredError("x")) == grpc.StatusCode.NOT_FOUND  # before its base RequestError
    assert DEMO.status_of(ConflictError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(TypeError, match="ValueError is not one of unison.test.v1.Demo's refusals"):
        DEMO.status_of(ValueError("x"))
    with pytest.raises(TypeError, match=r"unison.test.v1.Demo: no behaviour for \['Count', 'Join', 'Wait'\]"):
        handlers(DEMO, {"Echo": Demo().echo})  # type: ignore[dict-item]


def test_calls_of_every_reading_travel_and_count_their_bytes(demo: tuple[Demo, str, Gate]) -> None:
    behaviour, address, _ = demo
    sent: list[int] = []
    received: list[int] = []
    with open_channel(address) as channel:
        stub = Stub(channel, DEMO, token_metadata(SECRET), on_bytes_out=sent.append, on_bytes_in=received.append)
        assert stub.call("Echo", pb.AbortRequest(rank=1, reason="hi"), timeout=5) == pb.AbortRequest(rank=2, reason="hi")
        joined = stub.call("Join", lambda: iter([pb.AbortRequest(reason="a"), pb.AbortRequest(reason="b")]), timeout=5)
        assert (joined.rank, joined.reason) == (2, "ab")
        replies = stub.open("Count", iter([pb.HeartbeatRequest(cycles=c) for c in (3, 4)]), timeout=5)
        assert [r.abort for r in replies] == ["3", "4"]
    assert sum(sent) == behaviour.bytes_in > 0 and sum(received) == behaviour.bytes_out > 0
    assert len(sent) == 5 and len(received) == 4  # per message, both ways
    assert behaviour.refused == []


def test_refusals_end_the_call_with_their_status_and_the_caller_raises_its_own_error(
        demo: tuple[Demo, str, Gate]) -> None:
    behaviour, address, _ = demo
    with open_channel(address) as channel:
        stub = Stub(channel, DEMO, token_metadata(SECRET))
        for reason, code, text in (("missing", grpc.StatusCode.NOT_FOUND, "'missing' is not declared"),
                                   ("conflict", grpc.StatusCode.INVALID_ARGUMENT, "declared differently"),
                                   ("refuse", grpc.StatusCode.FAILED_PRECONDITION, "not now")):
            with pytest.raises(grpc.RpcError) as caught:
                stub.call("Echo", pb.AbortRequest(reason=reason), timeout=5)
            assert (caught.value.code(), caught.value.details()) == (code, text)
        with pytest.raises(RequestError, match=r"^refused: NOT_FOUND: 'missing' is not declared$"):
            stub.call("Echo", pb.AbortRequest(reason="missing"), timeout=5,
                      error=lambda exc: RequestError(f"refused: {exc.code().name}: {exc.details()}"))
        raw = channel.stream_unary(DEMO.path("Join"))
        with pytest.raises(grpc.RpcError, match=r"Join: message 1 \(3 bytes\) is not a valid AbortRequest \(.*\); "
                                                r"run the same version\."):
            raw(iter([pb.AbortRequest(reason="ok").SerializeToString(), b"\xff\xff\xff"]),
                metadata=token_metadata(SECRET), timeout=5)
        with pytest.raises(grpc.RpcError, match=r"Join: the call ended without a AbortRequest message\."):
            raw(iter([]), metadata=token_metadata(SECRET), timeout=5)
        one = channel.stream_unary(DEMO.path("Echo"))
        with pytest.raises(grpc.RpcError, match=r"Echo takes one AbortRequest message; the call ended without one\."):
            one(iter([]), metadata=token_metadata(SECRET), timeout=5)
        assert stub.call("Echo", pb.AbortRequest(rank=4), timeout=5).rank == 5  # the server goes on
    assert [method for method, _ in behaviour.refused] == ["Echo"] * 4 + ["Join", "Join", "Echo"]


def test_a_call_is_made_again_while_the_retry_policy_says_so(demo: tuple[Demo, str, Gate]) -> None:
    _, address, _ = demo
    down = "127.0.0.1:1"  # nothing listens there: every attempt fails UNAVAILABLE at once
    failures: list[str] = []
    with open_channel(down) as channel:
        stub = Stub(channel, DEMO, token_metadata(SECRET))

        def again(exc: grpc.RpcError) -> bool:
            failures.append(exc.code().name)
            return len(failures) < 3

        with pytest.raises(RuntimeError, match=r"^gave up after 3: UNAVAILABLE$"):
            stub.call("Echo", pb.AbortRequest(), timeout=5, retry=Retry(again, pause_seconds=0.01),
                      error=lambda exc: RuntimeError(f"gave up after {len(failures)}: {exc.code().name}"))
        assert failures == ["UNAVAILABLE"] * 3

        attempts: list[int] = []

        def before() -> None:
            attempts.append(1)
            if len(attempts) == 2:
                raise ConfigError("the server is lost")

        with pytest.raises(ConfigError, match="the server is lost"):
            stub.call("Echo", pb.AbortRequest(), timeout=5, retry=Retry(lambda exc: True, before, pause_seconds=0.01))
        assert len(attempts) == 2
    with open_channel(address) as channel:  # another status than the policy's is never tried again
        stub = Stub(channel, DEMO, token_metadata(SECRET))
        tried: list[str] = []
        with pytest.raises(grpc.RpcError):
            stub.call("Echo", pb.AbortRequest(reason="missing"), timeout=5,
                      retry=Retry(lambda exc: bool(tried.append(exc.code().name)) or True))
        assert tried == []


def test_a_call_waiting_for_its_answer_can_be_cancelled_from_another_thread(demo: tuple[Demo, str, Gate]) -> None:
    _, address, gate = demo
    with open_channel(address) as channel:
        stub = Stub(channel, DEMO, token_metadata(SECRET))
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                stub.call("Wait", pb.StatusRequest(), timeout=10)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 5
        while gate.statistics()["calls_active"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stub.cancel_in_flight() == 1
        thread.join(5)
        assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)
        assert str(outcome[0]) == "Wait was cancelled by this process"
        assert stub.cancel_in_flight() == 0


def test_the_gate_refuses_calls_without_the_secret_and_the_port_is_not_shared(demo: tuple[Demo, str, Gate]) -> None:
    _, address, gate = demo
    with open_channel(address) as channel:
        for metadata in ((), ((TOKEN_KEY, "u" * 64),)):
            with pytest.raises(grpc.RpcError) as caught:
                Stub(channel, DEMO, metadata).call("Echo", pb.AbortRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert gate.statistics() == {"calls_active": 0, "refused": 2, "over_limit": 0}
    with pytest.raises(ConfigError, match=rf"^the demo service cannot listen on {address}: "):
        serve(Gate(SECRET, 1, service="s", why="w"), handlers(DEMO, dict.fromkeys(
            ("Echo", "Count", "Join", "Wait"), Demo().echo)), address, who="the demo service", thread_name_prefix="x")
    assert REFUSAL_WORKERS == 8


def test_the_secret_is_checked_in_constant_time_and_travels_in_metadata() -> None:
    assert token_metadata(SECRET) == ((TOKEN_KEY, SECRET),)
    assert token_matches(SECRET, SECRET) and token_matches(SECRET.encode(), SECRET)
    assert not token_matches(None, SECRET) and not token_matches(SECRET[:-1], SECRET)


def test_the_heartbeat_loop_waits_first_and_stops_on_its_event_or_its_beat() -> None:
    stop, beats = threading.Event(), []
    every(0.001, stop, lambda: beats.append(1) or len(beats) < 3)
    assert len(beats) == 3
    stop.set()
    every(0.001, stop, lambda: beats.append(1) or True)  # already stopped: no beat at all
    assert len(beats) == 3
