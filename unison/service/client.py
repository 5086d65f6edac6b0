"""A rank's side of the gRPC service: the negotiation stream and its heartbeats (`unison.backends.grpc` builds the Backend on them)."""

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

from ..backends.base import Abandoned
from ..errors import AbortedError, ConfigError
from ..rpc.endpoints import open_channel
from ..rpc.heartbeat import every
from ..rpc.security import token_metadata
from ..rpc.stub import Stub
from . import coordinator_pb2 as pb
from .methods import ABORT_TOLD_SECONDS, COORDINATOR, RANK_KEY, RANKS_KEY

__all__ = ["ControlClient"]

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
        metadata = token_metadata(secret) + ((RANK_KEY, str(rank)),)
        # the ranks this client's exchanges carry (a host leader's host); only the leader negotiates
        self.speaks_for = tuple(speaks_for) or (rank,)
        self._stream_metadata = metadata + ((RANKS_KEY, ",".join(map(str, self.speaks_for))),)
        self._channel = open_channel(address)
        self._stub = Stub(self._channel, COORDINATOR, metadata)
        self._outbox: queue.SimpleQueue[pb.Exchange | None] = queue.SimpleQueue()
        # gRPC's call of the negotiation stream (None until register opens it); Any, not Optional, for
        # exchange() runs only on a client that negotiates
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

        def refused(exc: grpc.RpcError) -> ConfigError:
            return ConfigError(
                f"rank {self.rank} could not register with the coordinator service at {self.address} "
                f"within {timeout:.0f} s: {exc.code().name}: {exc.details()}. Check that every rank "
                "uses the same UNISON_SERVICE_ADDR, secret and UNISON_TLS_* settings (a service with TLS "
                "refuses plain-text clients), and that no firewall blocks the port.")

        reply = self._stub.call("Register", request, timeout=timeout, wait_for_ready=True, error=refused)
        if negotiate:
            self._replies = self._stub.open("Negotiate", self._requests(), metadata=self._stream_metadata)
        self._heartbeat.start()
        return reply

    def _requests(self) -> Iterator[pb.Exchange]:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            yield item

    def exchanges(self, phase: pb.Phase) -> int:
        """How many exchanges of this phase this client has started (the next one's sequence number)."""
        return self._sequences[phase]

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

        replies = self._stub.open("Heartbeats", requests())
        answered = [time.monotonic()]
        reader = threading.Thread(target=self._read_beats, args=(replies, answered),
                                  name=f"unison-heartbeat-replies-{self.rank}", daemon=True)
        reader.start()

        def beat() -> bool:
            if not reader.is_alive():
                return False
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
                return False
            cycles, waiting = self.progress()
            outbox.put(pb.HeartbeatRequest(rank=self.rank, cycles=cycles, waiting=list(waiting)[:1000]))
            return True

        every(_HEARTBEAT_SECONDS, self._closed, beat)
        if self.abort_reason and not reader.is_alive():
            # A reply carried the abort (or the service is gone). The end of this stream tells the
            # service that this rank knows why (a failing rank's Abort call waits for it), so it stays
            # open until `close`: the engine calls that once it has failed this rank's collectives
            # with the reason. Ended here, a loaded rank could be killed by the launcher, once the
            # failing rank left, before its collectives raised.
            self._closed.wait()
        outbox.put(None)
        replies.cancel()

    def _read_beats(self, replies: grpc.Call, answered: list[float]) -> None:
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
            self._stub.call("Abort", pb.AbortRequest(rank=self.rank, reason=reason), timeout=ABORT_TOLD_SECONDS + 2.0)
        except grpc.RpcError:
            pass  # best effort: the caller is failing already

    def _stop_sending(self) -> bool:
        """End the request and heartbeat streams once; False if that was done already."""
        if self._closed.is_set():
            return False
        self._closed.set()
        self._outbox.put(None)
        if self._beats is not None:
            self._beats.put(None)
        return True

    def close(self) -> None:
        """Close the stream (the service ends it; cancelled after 5 s) and the channel."""
        if not self._stop_sending():
            return
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
        if not self._stop_sending():
            return
        if self._replies is not None:
            self._replies.cancel()
        self._channel.close()
