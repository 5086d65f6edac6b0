"""The coordinator service in one process: pairing, authentication, limits, port ownership, liveness."""

from __future__ import annotations

import os
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from unison.config import load_settings
from unison.errors import AbortedError, ConfigError
from unison.rpc.endpoints import MAX_MESSAGE_BYTES
from unison.rpc.handlers import handlers
from unison.rpc.security import TOKEN_KEY, load_secret
from unison.rpc.stub import Stub
from unison.service import coordinator_pb2 as pb
from unison.service.client import ControlClient
from unison.service.methods import COORDINATOR, RANK_KEY, RANKS_KEY
from unison.service.rendezvous import JobAborted, Rendezvous, pack_parts, unpack_parts
from unison.service.server import CoordinatorServer
from unison.status import format_status

SECRET = "s" * 64


@pytest.fixture
def server():
    srv = CoordinatorServer(2, SECRET, "127.0.0.1:0", "test", heartbeat_timeout_seconds=30)
    yield srv
    srv.stop(0)


def stub(address: str, metadata: tuple[tuple[str, str], ...] = ((TOKEN_KEY, SECRET),),
         options: list[tuple[str, int]] | None = None) -> tuple[grpc.Channel, Stub]:
    """A plain channel (none of the service's options) and the service's methods on it, with `metadata`."""
    channel = grpc.insecure_channel(address, options=options)
    return channel, Stub(channel, COORDINATOR, metadata)


def in_threads(*fns):
    results = [None] * len(fns)

    def run(i, fn):
        results[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    return results


def test_rendezvous_pairs_exchanges_by_sequence() -> None:
    r = Rendezvous(3)
    rows = in_threads(*(lambda i=i: r.status([i], 0, [bytes([i])]) for i in range(3)))
    assert rows == [b"\x00\x01\x02"] * 3
    parts = in_threads(*(lambda i=i: r.gather([i], 0, [f"p{i}".encode()]) for i in range(3)))
    assert parts[0] == [b"p0", b"p1", b"p2"] and parts[1] is None and parts[2] is None
    got = in_threads(*(lambda i=i: r.broadcast([i], 0, b"resp" if i == 0 else b"") for i in range(3)))
    assert got == [b"resp"] * 3
    assert r.blocked() == {} and not r._slots  # everything collected, nothing left behind


def test_rendezvous_exchanges_may_speak_for_several_ranks() -> None:
    # ranks 0-2 on one host (one exchange), ranks 3-4 on another, rank 5 alone
    r = Rendezvous(6)
    hosts = [[0, 1, 2], [3, 4], [5]]
    rows = in_threads(*(lambda h=h: r.status(h, 0, [bytes([i]) for i in h]) for h in hosts))
    assert rows == [bytes(range(6))] * 3
    parts = in_threads(*(lambda h=h: r.gather(h, 0, [f"p{i}".encode() for i in h]) for h in hosts))
    assert parts[0] == [f"p{i}".encode() for i in range(6)] and parts[1] is None and parts[2] is None
    got = in_threads(*(lambda h=h: r.broadcast(h, 0, b"resp" if h[0] == 0 else b"") for h in hosts))
    assert got == [b"resp"] * 3
    assert r.blocked() == {} and not r._slots


def test_packed_parts_round_trip_and_refuse_malformed_input() -> None:
    parts = [b"", b"abc", bytes(1000)]
    assert unpack_parts(pack_parts(parts)) == parts
    for bad in (b"", b"\x02\x00\x00\x00", pack_parts(parts)[:-1], pack_parts(parts) + b"x"):
        with pytest.raises(ValueError, match="packed parts"):
            unpack_parts(bad)


def test_rendezvous_abort_releases_waiters() -> None:
    r = Rendezvous(2)
    threading.Timer(0.2, r.abort, args=("rank 1 vanished",)).start()
    with pytest.raises(JobAborted, match="rank 1 vanished"):
        r.status([0], 0, [b"x"])


def test_two_clients_negotiate_through_the_server(server: CoordinatorServer) -> None:
    clients = [ControlClient(server.address, SECRET, rank) for rank in range(2)]
    in_threads(*(lambda c=c: c.register("test") for c in clients))
    replies = in_threads(*(lambda c=c: c.exchange(pb.STATUS, bytes([c.rank]) * 8) for c in clients))
    assert [r.data for r in replies] == [b"\x00" * 8 + b"\x01" * 8] * 2
    status = server.status()
    assert [r.pid for r in status.ranks] == [os.getpid()] * 2
    for c in clients:
        c.close()
    assert server.wait_for_streams_closed(5)


def test_a_slow_cycle_costs_other_ranks_one_exchange(server: CoordinatorServer) -> None:
    """Rank 1's gather is answered with rank 0's broadcast of that cycle; only rank 0 may broadcast."""
    clients = [ControlClient(server.address, SECRET, rank) for rank in range(2)]
    in_threads(*(lambda c=c: c.register("test") for c in clients))
    before = server.statistics()["exchanges"]

    def rank0() -> bytes:
        parts = list(clients[0].exchange(pb.GATHER, b"req0").parts)
        return clients[0].exchange(pb.BROADCAST, b"answer to " + b"+".join(parts)).data

    sent, got = in_threads(rank0, lambda: clients[1].exchange(pb.GATHER, b"req1").data)
    assert sent == got == b"answer to req0+req1"
    assert server.statistics()["exchanges"] - before == 3  # two gathers, one broadcast
    with pytest.raises(AbortedError, match="only rank 0 sends BROADCAST"):
        clients[1].exchange(pb.BROADCAST, b"")
    for c in clients:
        c.close()


def test_a_host_leader_negotiates_for_its_host_and_no_rank_is_claimed_twice(server: CoordinatorServer) -> None:
    leader = ControlClient(server.address, SECRET, 0, speaks_for=[0, 1])
    leader.register("test")
    reply = leader.exchange(pb.STATUS, b"\x00" * 8 + b"\x01" * 8)  # both rows, one exchange
    assert reply.data == b"\x00" * 8 + b"\x01" * 8
    channel, s = stub(server.address, ((TOKEN_KEY, SECRET), (RANK_KEY, "1"), (RANKS_KEY, "1")))
    with channel:
        stream = s.open("Negotiate", iter([pb.Exchange(phase=pb.STATUS, data=b"\x01" * 8)]), timeout=5)
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
    leader.close()
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "ranks [1] already negotiate through the stream of rank 0" in info.value.details()


@pytest.mark.parametrize("metadata", [(), ((TOKEN_KEY, "wrong" * 10),), ((TOKEN_KEY, SECRET[:-1] + "t"),)])
def test_calls_without_the_secret_are_refused_and_the_service_goes_on(server, metadata) -> None:
    channel, s = stub(server.address, metadata)
    with channel:
        for call in (lambda: s.call("Status", pb.StatusRequest(), timeout=5),
                     lambda: s.call("Register", pb.RegisterRequest(rank=0, version="test"), timeout=5),
                     lambda: list(s.open("Negotiate", iter([pb.Exchange(phase=pb.STATUS)]), timeout=5))):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = stub(server.address)[1].call("Status", pb.StatusRequest(), timeout=5)
        assert ok.size == 2
    assert server.statistics()["refused"] == 3


def test_oversized_messages_and_random_bytes_are_refused(server: CoordinatorServer) -> None:
    channel, s = stub(server.address, ((TOKEN_KEY, SECRET), (RANK_KEY, "0")),
                      options=[("grpc.max_send_message_length", -1)])
    with channel:
        big = pb.HeartbeatRequest(rank=0, waiting=["x" * (MAX_MESSAGE_BYTES + 16)])
        with pytest.raises(grpc.RpcError) as info:
            s.call("Heartbeat", big, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    host, port = server.address.rsplit(":", 1)
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(np.random.default_rng(0).bytes(4096))
            raw.settimeout(2)
            try:
                raw.recv(1024)
            except OSError:
                pass
    channel, s = stub(server.address)
    with channel:
        assert s.call("Status", pb.StatusRequest(), timeout=5).size == 2


def test_the_port_is_not_shared(server: CoordinatorServer) -> None:
    with pytest.raises(ConfigError, match=f"cannot listen on {server.address}"):
        CoordinatorServer(2, SECRET, server.address, "test")


def test_bad_addresses_are_refused() -> None:
    with pytest.raises(ConfigError, match="must be host:port"):
        CoordinatorServer(2, SECRET, "localhost", "test")


def test_silent_rank_aborts_the_job_with_its_rank_named() -> None:
    # 3 s: rank 0 here beats every second from this very process, which a loaded machine can delay by
    # more than a second; with a 1 s bound its own late beat was named instead of rank 1.
    srv = CoordinatorServer(2, SECRET, "127.0.0.1:0", "test", heartbeat_timeout_seconds=3.0)
    try:
        channel, s = stub(srv.address, ((TOKEN_KEY, SECRET), (RANK_KEY, "1")))
        with channel:  # rank 1 registers, then never beats again
            s.call("Register", pb.RegisterRequest(rank=1, host="h1", pid=4242, version="test"), timeout=5)
        client = ControlClient(srv.address, SECRET, 0)
        client.register("test")
        start = time.monotonic()
        with pytest.raises(AbortedError, match=r"rank 1 \(h1, pid 4242\) sent no heartbeat for [3-9]\.\d s"):
            client.exchange(pb.STATUS, b"row")  # waits for rank 1's row until the abort
        assert time.monotonic() - start < 15
        assert "ABORTING: rank 1" in format_status(srv.status())
        client.close()
    finally:
        srv.stop(0)


def test_heartbeats_travel_on_one_stream_and_carry_progress(server: CoordinatorServer) -> None:
    client = ControlClient(server.address, SECRET, 1, progress=lambda: (7, ["grad.w"]), speaks_for=[1])
    client.register("test", negotiate=False)
    deadline = time.monotonic() + 10
    while server.status().ranks[1].cycles != 7 and time.monotonic() < deadline:
        time.sleep(0.1)
    row = server.status().ranks[1]
    assert (row.cycles, list(row.waiting)) == (7, ["grad.w"])
    assert client._beats is not None  # the stream's outbox: beats are messages, not calls
    client.close()
    assert not client.abort_reason


def test_a_rank_0_that_stops_answering_heartbeats_aborts_the_job() -> None:
    """The service accepts the heartbeat stream but never answers (as when rank 0 is stopped)."""
    def unanswered(requests, context):
        for _ in requests:
            pass
        return iter(())

    behaviours = {m.name: (lambda request, context: None) for m in COORDINATOR.methods}
    behaviours.update(Register=lambda request, context: pb.RegisterReply(size=2), Heartbeats=unanswered)
    from concurrent import futures

    mute = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    mute.add_generic_rpc_handlers((handlers(COORDINATOR, behaviours),))
    port = mute.add_insecure_port("127.0.0.1:0")
    mute.start()
    aborted = threading.Event()
    client = ControlClient(f"127.0.0.1:{port}", SECRET, 1, answer_timeout_seconds=1.5)
    client.on_abort = lambda reason: aborted.set()
    try:
        client.register("test", negotiate=False)
        assert aborted.wait(10)
        assert "got no answer to its heartbeats from the coordinator service" in client.abort_reason
        assert "rank 0 is stopped or unreachable" in client.abort_reason
    finally:
        client.close()
        mute.stop(0)


def test_version_mismatch_is_refused(server: CoordinatorServer) -> None:
    client = ControlClient(server.address, SECRET, 1)
    with pytest.raises(ConfigError, match="runs unison 9.9, rank 0 runs test"):
        client.register("9.9", timeout=5)


def test_secret_sources(tmp_path) -> None:
    assert load_secret(load_settings({})) is None
    assert load_secret(load_settings({"UNISON_SECRET": SECRET})) == SECRET
    with pytest.raises(ConfigError, match="at least 32 characters; it has 5"):
        load_secret(load_settings({"UNISON_SECRET": "short"}))
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="accessible to group or others .mode 0644.; make it private"):
        load_secret(load_settings({"UNISON_SECRET_FILE": str(path)}))
    path.chmod(0o600)
    assert load_secret(load_settings({"UNISON_SECRET_FILE": str(path)})) == SECRET
