"""A rank's side of the gRPC service: the negotiation stream, heartbeats, and the Backend built on them."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import numpy as np

from ..backends.base import Abandoned
from ..errors import AbortedError, ConfigError
from ..ops import ReduceOp
from . import coordinator_pb2 as pb
from . import coordinator_pb2_grpc as pb_grpc
from .rendezvous import pack_parts
from .security import TOKEN_KEY
from .server import ABORT_TOLD_SECONDS, CHANNEL_OPTIONS, RANK_KEY, RANKS_KEY

__all__ = ["ControlClient", "GrpcBackend"]

log = logging.getLogger(__name__)

_HEARTBEAT_SECONDS = 1.0
_CLOSE_SECONDS = 5.0  # how long `close` lets the service end the negotiation stream before cancelling it


class ControlClient:
    """One rank's connection to the coordinator service.

    Args:
        address: the service's ``host:port``.
        secret: the job secret.
        rank: this rank.
        progress: returns (cycles, names waiting) for heartbeats; may be replaced after construction.
        speaks_for: the ranks this client negotiates for (a host leader's host), itself first.
        answer_timeout_seconds: rank 0 leaving the heartbeats unanswered this long aborts this rank
            (``UNISON_HEARTBEAT_TIMEOUT_SECONDS``, the bound rank 0 applies to the other ranks).
    """

    def __init__(self, address: str, secret: str, rank: int,
                 progress: Callable[[], tuple[int, Sequence[str]]] | None = None,
                 speaks_for: Sequence[int] = (), answer_timeout_seconds: float = 10.0) -> None:
        self.address = address
        self.rank = rank
        self.answer_timeout_seconds = answer_timeout_seconds
        self.progress = progress or (lambda: (0, ()))
        self._metadata = ((TOKEN_KEY, secret), (RANK_KEY, str(rank)))
        # the ranks this client's exchanges carry (a host leader's host); only the leader negotiates
        self.speaks_for = tuple(speaks_for) or (rank,)
        self._stream_metadata = self._metadata + ((RANKS_KEY, ",".join(map(str, self.speaks_for))),)
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._outbox: queue.SimpleQueue[pb.Exchange | None] = queue.SimpleQueue()
        self._replies: Any = None
        self._sequences = {pb.STATUS: 0, pb.GATHER: 0, pb.BROADCAST: 0}
        self._closed = threading.Event()
        self.abort_reason = ""
        self.on_abort: Callable[[str], None] | None = None
        self._heartbeat = threading.Thread(target=self._beat, name=f"unison-heartbeat-{rank}", daemon=True)
        self._beats: queue.SimpleQueue[pb.HeartbeatRequest | None] | None = None

    def __repr__(self) -> str:
        return f"<ControlClient rank={self.rank} -> {self.address}>"

    def register(self, version: str, timeout: float = 60.0, negotiate: bool = True) -> pb.RegisterReply:
        """Register with the service (waiting for it to come up), open the negotiation stream unless
        this rank's host leader negotiates for it, and start heartbeats."""
        request = pb.RegisterRequest(rank=self.rank, host=socket.gethostname(), pid=os.getpid(),
                                     version=version)
        try:
            reply = self._stub.Register(request, metadata=self._metadata, timeout=timeout,
                                        wait_for_ready=True)
        except grpc.RpcError as exc:
            raise ConfigError(
                f"rank {self.rank} could not register with the coordinator service at {self.address} "
                f"within {timeout:.0f} s: {exc.code().name}: {exc.details()}. Check that every rank "
                "uses the same UNISON_SERVICE_ADDR and secret, and that no firewall blocks the port."
            ) from None
        if negotiate:
            self._replies = self._stub.Negotiate(self._requests(), metadata=self._stream_metadata)
        self._heartbeat.start()
        return reply

    def _requests(self) -> Iterator[pb.Exchange]:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            yield item

    def exchange(self, phase: pb.Phase, data: bytes) -> pb.ExchangeReply:
        """Run one control-plane exchange; raises `AbortedError` if the job is being aborted."""
        sequence = self._sequences[phase]
        self._sequences[phase] = sequence + 1
        self._outbox.put(pb.Exchange(phase=phase, sequence=sequence, data=data))
        try:
            reply = next(self._replies)
        except grpc.RpcError as exc:
            if self._closed.is_set():
                raise Abandoned() from None
            reason = self.abort_reason or (
                f"lost the coordinator service at {self.address}: {exc.code().name}: {exc.details()} "
                "(rank 0 died or stopped)"
            )
            raise AbortedError(reason) from None
        except StopIteration:
            raise Abandoned() from None
        if reply.abort:
            raise AbortedError(reply.abort)
        return reply

    def _beat(self) -> None:
        """Send a heartbeat every second on one stream, and watch that rank 0 answers them."""
        outbox: queue.SimpleQueue[pb.HeartbeatRequest | None] = queue.SimpleQueue()
        self._beats = outbox

        def requests() -> Iterator[pb.HeartbeatRequest]:
            while (item := outbox.get()) is not None:
                yield item

        replies = self._stub.Heartbeats(requests(), metadata=self._metadata)
        answered = [time.monotonic()]
        reader = threading.Thread(target=self._read_beats, args=(replies, answered),
                                  name=f"unison-heartbeat-replies-{self.rank}", daemon=True)
        reader.start()
        while not self._closed.wait(_HEARTBEAT_SECONDS) and reader.is_alive():
            silent = time.monotonic() - answered[0]
            if silent > self.answer_timeout_seconds:
                self._aborted(f"rank {self.rank} got no answer to its heartbeats from the coordinator "
                              f"service at {self.address} for {silent:.0f} s "
                              f"(UNISON_HEARTBEAT_TIMEOUT_SECONDS={self.answer_timeout_seconds:g}): rank 0 "
                              "is stopped or unreachable")
                # rank 0 will not answer the exchange this rank may be waiting in either: end it, so
                # the engine fails its collectives with the reason instead of waiting forever
                if self._replies is not None:
                    self._replies.cancel()
                break
            cycles, waiting = self.progress()
            outbox.put(pb.HeartbeatRequest(rank=self.rank, cycles=cycles, waiting=list(waiting)[:1000]))
        outbox.put(None)
        replies.cancel()

    def _read_beats(self, replies: Any, answered: list[float]) -> None:
        try:
            for reply in replies:
                answered[0] = time.monotonic()
                if reply.abort:
                    self._aborted(reply.abort)
                    return
        except grpc.RpcError as exc:
            if not self._closed.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                self._aborted(f"rank {self.rank} lost the coordinator service at {self.address} "
                              f"({exc.code().name}): rank 0 died or is unreachable")

    def _aborted(self, reason: str) -> None:
        if not self.abort_reason:
            self.abort_reason = reason
            log.error("job aborted: %s", reason)
            if self.on_abort is not None:
                self.on_abort(reason)

    def abort(self, reason: str) -> None:
        """Ask the service to abort the job; returns once the other ranks were told (best effort, 5 s
        at most)."""
        try:
            self._stub.Abort(pb.AbortRequest(rank=self.rank, reason=reason), metadata=self._metadata,
                             timeout=ABORT_TOLD_SECONDS + 2.0)
        except grpc.RpcError:
            pass  # best effort: the caller is failing already

    def close(self) -> None:
        """Close the stream (the service ends it; cancelled after 5 s) and the channel."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._outbox.put(None)
        if self._beats is not None:
            self._beats.put(None)
        if self._replies is not None:
            cancel = threading.Timer(_CLOSE_SECONDS, self._replies.cancel)
            cancel.daemon = True
            cancel.start()
            try:
                for _ in self._replies:  # drain until the server ends the stream
                    pass
            except grpc.RpcError:
                pass  # the stream is going away either way
            cancel.cancel()
        self._channel.close()

    def cancel(self) -> None:
        """Cancel the stream and close the channel at once (peers stopped answering)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._outbox.put(None)
        if self._beats is not None:
            self._beats.put(None)
        if self._replies is not None:
            self._replies.cancel()
        self._channel.close()


class GrpcBackend:
    """Control plane over the coordinator service, data plane delegated to another backend (MPI)."""

    name = "grpc+mpi"

    def __init__(self, control: ControlClient, data: Any, size: int, server: Any = None,
                 host_ranks: Sequence[int] = ()) -> None:
        self.control = control
        self.data = data
        self.rank = control.rank
        self.size = size
        self.server = server  # rank 0 owns the service; closed after the engine's last cycle
        # With host aggregation: this host's global ranks, lowest (the leader) first; the leader
        # gathers the host's rows and payloads over shared memory and negotiates for all of them.
        self.host_ranks = tuple(host_ranks)
        self.leader = not self.host_ranks or self.host_ranks[0] == self.rank
        self._answer: bytes | None = None  # rank 0's broadcast, received as the reply to our gather
        # Why the engine failed, or "" (a normal end, or an abort every rank already knows); set by
        # `setup.watch_engine`. On a failure, `close` tells the service before leaving it.
        self.failure: Callable[[], str] = lambda: ""
        self._abandoned = False

    def __repr__(self) -> str:
        host = f" host_ranks={list(self.host_ranks)}" if self.host_ranks else ""
        return f"<GrpcBackend rank={self.rank} size={self.size}{host} service={self.control.address}>"

    def statistics(self) -> dict[str, float]:
        out = dict(self.data.statistics())
        out["service_sequence_status"] = self.control._sequences[pb.STATUS]
        return out

    def interrupt(self, reason: str) -> None:
        """The job is being aborted: stop waiting for host peers (they may be gone)."""
        if self.host_ranks:
            self.data.fail_waits(reason)

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        mine = np.ascontiguousarray(row, dtype="<u8").tobytes()
        if not self.host_ranks:
            reply = self.control.exchange(pb.STATUS, mine)
            return np.frombuffer(reply.data, dtype="<u8").reshape(self.size, -1)
        rows = self.data.host_gather_bytes(mine, [len(mine)] * len(self.host_ranks))
        matrix = self.control.exchange(pb.STATUS, b"".join(rows)).data if self.leader else None
        return np.frombuffer(self.data.host_broadcast_bytes(matrix), dtype="<u8").reshape(self.size, -1)

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        if self.host_ranks:
            parts = self.data.host_gather_bytes(payload, [lengths[r] for r in self.host_ranks])
            if not self.leader:
                return None
            payload = pack_parts(parts)
        reply = self.control.exchange(pb.GATHER, payload)
        if self.rank == 0:
            return list(reply.parts)
        # Ranks other than 0: the service answers the gather with rank 0's broadcast of this cycle
        # (the engine always follows a gather with that broadcast); broadcast_bytes hands it out.
        self._answer = bytes(reply.data)
        return None

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        if self.rank == 0:
            self.control.exchange(pb.BROADCAST, payload or b"")
            payload = payload or b""
        elif self.leader:
            payload, self._answer = self._answer, None
            if payload is None:
                raise RuntimeError("broadcast_bytes without a gather_bytes before it in this cycle")
        if not self.host_ranks:
            return payload or b""
        return self.data.host_broadcast_bytes(payload if self.leader else None)

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        self.data.allreduce_(buf, op, process_set_id, after_chunk)

    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        self.data.allreduce_pieces_(buf, combine, process_set_id)

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        self.data.allgatherv(send, recv, counts, process_set_id)

    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        self.data.broadcast_(buf, root, process_set_id)

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        self.data.alltoallv(send, send_counts, recv, recv_counts, process_set_id)

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        self.data.reducescatter(send, recv, recv_counts, op, process_set_id)

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        self.data.add_process_set(process_set_id, ranks)

    def remove_process_set(self, process_set_id: int) -> None:
        self.data.remove_process_set(process_set_id)

    def abandon(self) -> None:
        """Peers did not answer shutdown: cancel the stream (and, on rank 0, stop the service) at once."""
        self._abandoned = True
        self.control.cancel()
        if self.server is not None:
            self.server.stop(grace_seconds=0.0)
        self.data.abandon()

    def close(self) -> None:
        """Leave the service after the engine's last cycle; rank 0 then waits for the other ranks'
        streams (10 s at most) and stops it.

        If the engine failed, the reason goes to the service first (an ``Abort`` call), so every rank
        learns the cause instead of "rank 0 died or is unreachable" when rank 0's service goes away;
        the call returns once every other rank's heartbeat carried the reason (3 s at most), so this
        process (rank 0's service included) stays until they know.
        """
        reason = self.failure()
        if reason and not self._abandoned:
            self.control.abort(reason)
        self.control.close()
        if self.server is not None:
            if not self._abandoned:
                self.server.wait_for_streams_closed(timeout=10.0)
            self.server.stop()
        self.data.close()
