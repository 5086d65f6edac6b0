"""The gRPC coordinator service hosted by rank 0: authentication, exchanges, heartbeats, status, abort."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc

from ..config import split_service_addr
from ..rpc.endpoints import serve
from ..rpc.gate import Gate
from ..rpc.handlers import handlers
from ..rpc.heartbeat import every
from . import coordinator_pb2 as pb
from .methods import ABORT_TOLD_SECONDS, COORDINATOR, RANK_KEY, RANKS_KEY
from .rendezvous import JobAborted, Rendezvous, unpack_parts

__all__ = ["CoordinatorServer"]

log = logging.getLogger(__name__)

_WATCH_SECONDS = 0.25  # how often the service looks for ranks whose heartbeats stopped


class _RankState:
    __slots__ = ("beating", "cycles", "host", "last_seen", "pid", "streams", "waiting")

    def __init__(self) -> None:
        self.host = ""
        self.pid = 0
        self.cycles = 0
        self.last_seen = 0.0
        self.waiting: tuple[str, ...] = ()
        self.streams = 0  # open Negotiate streams
        self.beating = 0  # open Heartbeats streams


class _Servicer:
    """The methods of the service (`methods.COORDINATOR`); `rpc.handlers` parses their requests."""

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        srv = self.server
        if not 0 <= request.rank < srv.size:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"rank must be in range(size={srv.size}); got {request.rank}")
        if request.version != srv.version:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"rank {request.rank} runs unison {request.version}, rank 0 runs {srv.version}")
        with srv.lock:
            state = srv.ranks[request.rank]
            state.host, state.pid, state.last_seen = request.host, request.pid, time.monotonic()
            members = [pb.Member(rank=r, host=s.host, pid=s.pid) for r, s in enumerate(srv.ranks) if s.pid]
        return pb.RegisterReply(size=srv.size, members=members)

    def Negotiate(self, requests: Iterator[pb.Exchange], context: grpc.ServicerContext) -> Iterator[pb.ExchangeReply]:
        srv = self.server
        rank = srv.rank_of(context)
        ranks = srv.ranks_of(context, rank)
        rendezvous = srv.rendezvous
        with srv.lock:
            srv.ranks[rank].streams += 1
        try:
            for exchange in requests:
                with srv.lock:
                    srv.exchanges += 1
                reply = pb.ExchangeReply(phase=exchange.phase, sequence=exchange.sequence)
                try:
                    if exchange.phase == pb.STATUS:
                        width, extra = divmod(len(exchange.data), len(ranks))
                        if extra:
                            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "status rows of unequal size")
                        rows = [exchange.data[i * width : (i + 1) * width] for i in range(len(ranks))]
                        reply.data = rendezvous.status(ranks, exchange.sequence, rows)
                    elif exchange.phase == pb.GATHER:
                        parts = rendezvous.gather(ranks, exchange.sequence, srv.parts_of(context, ranks, exchange.data))
                        if parts is not None:
                            reply.parts.extend(parts)
                        else:
                            # A rank other than 0 has nothing to do between its gather and rank 0's
                            # answer, so the reply waits for the broadcast of the same cycle and
                            # carries it: one exchange per slow cycle instead of two.
                            reply.data = rendezvous.broadcast(ranks, exchange.sequence, b"")
                    elif exchange.phase == pb.BROADCAST:
                        if ranks[0] != 0:
                            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                          "only rank 0 sends BROADCAST; other ranks get it as their GATHER's reply")
                        reply.data = rendezvous.broadcast(ranks, exchange.sequence, exchange.data)
                    else:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown exchange phase")
                except JobAborted as exc:
                    reply.abort = str(exc)
                yield reply
        finally:
            with srv.lock:
                srv.ranks[rank].streams -= 1
                srv.lock.notify_all()

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatReply:
        return self.server.heard(self.server.rank_of(context), request)

    def Heartbeats(self, requests: Iterator[pb.HeartbeatRequest],
                   context: grpc.ServicerContext) -> Iterator[pb.HeartbeatReply]:
        srv = self.server
        rank = srv.rank_of(context)
        with srv.lock:
            srv.ranks[rank].beating += 1
        try:
            for request in requests:
                yield srv.heard(rank, request)
        finally:
            with srv.lock:
                srv.ranks[rank].beating -= 1
                srv.lock.notify_all()

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return self.server.status()

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortReply:
        self.server.abort(request.reason or f"rank {request.rank} asked the job to stop")
        # A rank whose host leader waits for it over MPI learns of the abort only from a heartbeat's
        # reply: answer once every other rank has acted on it, so the caller does not leave (and its
        # launcher end the job) before they know why.
        self.server.wait_until_told(ABORT_TOLD_SECONDS, besides=request.rank)
        return pb.AbortReply()


class CoordinatorServer:
    """The service of one job, run by rank 0 (a gRPC server on a thread pool, plus a liveness monitor).

    Args:
        size: ranks in the job.
        secret: the job secret every call must present.
        address: ``host:port`` to bind (port 0: any free port).
        version: unison's version; ranks running another one are refused at registration.
        heartbeat_timeout_seconds: a registered rank silent this long aborts the job.
    """

    def __init__(self, size: int, secret: str, address: str, version: str,
                 heartbeat_timeout_seconds: float = 10.0) -> None:
        self.size = size
        self.version = version
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.rendezvous = Rendezvous(size)
        self.exchanges = 0  # Negotiate messages received (under `lock`)
        self.lock = threading.Condition()
        self.ranks = [_RankState() for _ in range(size)]
        self._speaker: dict[int, int] = {}  # rank -> the rank whose stream speaks for it
        # Each rank holds a worker with its heartbeat stream and, unless its host leader speaks for it,
        # one with its negotiation stream; the rest serve short calls. The gate admits calls with the
        # secret up to 3 x ranks + 8 at once and refuses every other call without taking a slot, so
        # 8 workers are always left for those refusals (each takes microseconds).
        self._gate = Gate(secret, limit=3 * size + 8, service="the coordinator service",
                          why="a rank keeps at most two open for the job's lifetime")
        host, _ = split_service_addr(address)
        if host in ("0.0.0.0", "::", "[::]"):
            log.warning("the coordinator service listens on every interface (%s) as "
                        "UNISON_SERVICE_ADDR asks; calls still need the job secret.", address)
        servicer = _Servicer(self)
        self._server, bound = serve(self._gate, handlers(COORDINATOR, {m.name: getattr(servicer, m.name)
                                                                       for m in COORDINATOR.methods}),
                                    address, who="The coordinator service", thread_name_prefix="unison-service")
        self.address = f"{host}:{bound}"
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=every, args=(_WATCH_SECONDS, self._stop, self._watch),
                                         name="unison-service-monitor", daemon=True)
        self._monitor.start()

    def __repr__(self) -> str:
        return f"<CoordinatorServer {self.address} size={self.size} {self.rendezvous!r}>"

    def statistics(self) -> dict[str, int]:
        """Counters: exchanges served; calls being served, refused for a missing or wrong secret, and
        refused because the limit of calls with the secret was reached."""
        return {"exchanges": self.exchanges, **self._gate.statistics()}

    def rank_of(self, context: grpc.ServicerContext) -> int:
        metadata = dict(context.invocation_metadata())
        text = metadata.get(RANK_KEY, "")
        if not str(text).isdigit() or not 0 <= int(text) < self.size:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{RANK_KEY} must name a rank of the job")
        return int(text)

    def ranks_of(self, context: grpc.ServicerContext, rank: int) -> list[int]:
        """The ranks a Negotiate stream speaks for: RANKS_KEY's list, led by `rank`, or `rank` alone."""
        text = str(dict(context.invocation_metadata()).get(RANKS_KEY, "") or rank)
        items = text.split(",")
        if not all(i.isdigit() for i in items):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{RANKS_KEY} must list ranks of the job")
        ranks = [int(i) for i in items]
        if ranks[0] != rank or ranks != sorted(set(ranks)) or ranks[-1] >= self.size:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{RANKS_KEY} must list distinct ranks of the job in order, starting with {RANK_KEY}")
        with self.lock:
            taken = {r: self._speaker[r] for r in ranks if self._speaker.get(r, rank) != rank}
            if not taken:
                self._speaker.update(dict.fromkeys(ranks, rank))
        if taken:  # two streams speaking for one rank would count it twice
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          f"ranks {sorted(taken)} already negotiate through the stream of rank {min(taken.values())}")
        return ranks

    @staticmethod
    def parts_of(context: grpc.ServicerContext, ranks: list[int], data: bytes) -> list[bytes]:
        """One gather payload per rank of the stream (packed with `pack_parts` when several)."""
        if len(ranks) == 1:
            return [data]
        try:
            parts = unpack_parts(data)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if len(parts) != len(ranks):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(parts)} payloads for {len(ranks)} ranks")
        return parts

    def heard(self, rank: int, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        """Record a heartbeat of `rank`; the reply carries the abort reason, if any."""
        with self.lock:
            state = self.ranks[rank]
            state.last_seen = time.monotonic()
            state.cycles = request.cycles
            state.waiting = tuple(request.waiting)
        return pb.HeartbeatReply(abort=self.rendezvous.aborted)

    def wait_until_told(self, timeout: float, besides: int = -1) -> list[int]:
        """After an abort, wait until every rank (`besides` aside) has closed its heartbeat stream; return
        those that still have one open after `timeout`.

        A rank learns the reason from a reply (an exchange's, or a heartbeat's within a second) and keeps
        its heartbeat stream open until its engine has failed its collectives with it and closed the
        client (`ControlClient.close`), or the process leaves. A reply merely sent is not enough: under
        load the caller's Abort call returned before the rank had read it, the caller left, and its
        launcher killed the rank before its collectives raised, so the cause never showed there.
        """
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                untold = [r for r, s in enumerate(self.ranks) if s.beating and r != besides]
                left = deadline - time.monotonic()
                if not untold or left <= 0:
                    return untold
                self.lock.wait(left)

    def abort(self, reason: str) -> None:
        """Abort the job: every waiting and future exchange answers with `reason`."""
        if not self.rendezvous.aborted:
            log.error("aborting the job: %s", reason)
        self.rendezvous.abort(reason)

    def _watch(self) -> bool:
        """Abort the job if a registered rank's heartbeats stopped (the watch thread's beat)."""
        now = time.monotonic()
        with self.lock:
            silent = [(r, s) for r, s in enumerate(self.ranks)
                      if s.last_seen and now - s.last_seen > self.heartbeat_timeout_seconds]
        if silent and not self.rendezvous.aborted:
            rank, state = silent[0]
            self.abort(
                f"rank {rank} ({state.host}, pid {state.pid}) sent no heartbeat for "
                f"{now - state.last_seen:.1f} s (UNISON_HEARTBEAT_TIMEOUT_SECONDS="
                f"{self.heartbeat_timeout_seconds:g}); it died or is stopped."
            )
        return True

    def status(self) -> pb.StatusReply:
        """The live table served by the Status call."""
        now = time.monotonic()
        reply = pb.StatusReply(size=self.size, abort=self.rendezvous.aborted)
        with self.lock:
            waiting = [set(s.waiting) for s in self.ranks]
            everyone = set().union(*waiting) if waiting else set()
            for rank, state in enumerate(self.ranks):
                reply.ranks.add(
                    rank=rank, host=state.host, pid=state.pid, cycles=state.cycles,
                    seconds_since_heartbeat=(now - state.last_seen) if state.last_seen else -1.0,
                    waiting=sorted(waiting[rank]),
                    others_wait_for=sorted(everyone - waiting[rank]),
                )
        return reply

    def wait_for_streams_closed(self, timeout: float) -> bool:
        """Wait until every rank closed its negotiation stream (the job's last cycle is done)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while any(s.streams for s in self.ranks):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(left)
        return True

    def stop(self, grace_seconds: float = 2.0) -> None:
        """Stop serving: in-flight calls get `grace_seconds`, then are cancelled.

        An exchange still waiting for its partners ends with the reason instead of waiting forever (its
        worker thread would keep the process from exiting); heartbeats are not told, since on a normal
        shutdown the other ranks may still be closing their streams. Returns within
        `grace_seconds` + 5 s even if gRPC does not finish every call (logged).
        """
        self._stop.set()
        self.rendezvous.close("the coordinator service on rank 0 stopped while this exchange waited "
                              "for other ranks")
        if not self._server.stop(grace_seconds).wait(grace_seconds + 5.0):
            log.warning("the coordinator service did not finish its calls within %.0f s of stopping; "
                        "leaving them.", grace_seconds + 5.0)
