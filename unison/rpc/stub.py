"""The caller's side of a method table: every call of a service through one wrapper.

`Stub.call` makes one call and waits for its answer: with the caller's metadata and deadline, made
again after a failure its `Retry` policy names, and with a failure it does not retry turned into the
unison error the caller raises (`error`). `Stub.open` starts a long-lived stream (a rank's negotiation
and heartbeats) and hands back gRPC's call, to read replies from and cancel. A call of `Stub.call`
still waiting can be cancelled from another thread (`cancel_in_flight`); it then raises `Cancelled`.

Example (``service`` a `methods.Service` with a method ``Ping`` taking and answering ``Empty``):
    >>> stub = Stub(open_channel("127.0.0.1:6001"), service, token_metadata(secret))  # doctest: +SKIP
    >>> stub.call("Ping", Empty(), timeout=5.0,                                        # doctest: +SKIP
    ...           error=lambda exc: ConfigError(f"no answer: {exc.code().name}"))
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from .methods import Method, Service

if TYPE_CHECKING:
    from google.protobuf.message import Message

    _MultiCallable: TypeAlias = (grpc.UnaryUnaryMultiCallable | grpc.UnaryStreamMultiCallable
                                 | grpc.StreamUnaryMultiCallable | grpc.StreamStreamMultiCallable)

__all__ = ["Cancelled", "Retry", "Stub"]


class Cancelled(Exception):
    """A call of `Stub.call` was cancelled by this process (`Stub.cancel_in_flight`) before its answer."""


def _go_on() -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Retry:
    """When a failed call is made again: a failure with one of `codes`, while `again(failure)` says so.

    Attributes:
        again: told of each such failure (to note it); False ends the retries, the failure then
            being translated as any other.
        before: runs before every attempt, the first included; raises to give up.
        codes: the statuses worth another attempt (a server down or restarting: ``UNAVAILABLE``).
        pause_seconds: the pause before the next attempt.
    """

    again: Callable[[grpc.RpcError], bool]
    before: Callable[[], None] = _go_on
    codes: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})
    pause_seconds: float = 0.2


class Stub:
    """`service`'s methods on `channel`, each call carrying `metadata`.

    Args:
        channel: the channel (`endpoints.open_channel`).
        service: the method table.
        metadata: sent with every call (the job secret's token, a rank).
        on_bytes_out: called with the size of every request message sent.
        on_bytes_in: called with the size of every reply message received.
    """

    def __init__(self, channel: grpc.Channel, service: Service, metadata: Sequence[tuple[str, str]] = (), *,
                 on_bytes_out: Callable[[int], None] | None = None,
                 on_bytes_in: Callable[[int], None] | None = None) -> None:
        self.service = service
        self.metadata = tuple(metadata)
        self._on_bytes_out = on_bytes_out
        self._on_bytes_in = on_bytes_in
        self._callables = {m.name: self._callable(channel, m) for m in service.methods}
        self._lock = threading.Lock()
        self._in_flight: set[grpc.Future] = set()  # a streaming call is a future too

    def __repr__(self) -> str:
        return f"<Stub {self.service.name} in_flight={len(self._in_flight)}>"

    def _callable(self, channel: grpc.Channel, method: Method) -> _MultiCallable:
        make = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
                (True, False): channel.stream_unary, (True, True): channel.stream_stream}
        return make[method.streams_requests, method.streams_replies](
            self.service.path(method.name), request_serializer=self._serialize,
            response_deserializer=self._parser(method.reply))

    def _serialize(self, message: Message) -> bytes:
        data = bytes(message.SerializeToString())
        if self._on_bytes_out is not None:
            self._on_bytes_out(len(data))
        return data

    def _parser(self, reply: type[Message]) -> Callable[[bytes], Message]:
        def parse(data: bytes) -> Message:
            if self._on_bytes_in is not None:
                self._on_bytes_in(len(data))
            return reply.FromString(data)

        return parse

    def open(self, method: str, requests: Iterator[Message], *, metadata: Sequence[tuple[str, str]] | None = None,
             timeout: float | None = None) -> grpc.Call:
        """Start a call whose replies stream (gRPC's call: iterate it for the replies, `cancel()` it).

        `metadata` replaces the stub's for this call (a rank's negotiation stream names the ranks it
        speaks for); `timeout` is the call's deadline (None: the call lasts as long as the job).
        """
        if not self.service[method].streams_replies:
            raise TypeError(f"{method} answers once; use call()")
        return self._callables[method](requests, metadata=self.metadata if metadata is None else tuple(metadata),
                                       timeout=timeout)

    def call(self, method: str, request: Message | Callable[[], Iterator[Message]], *, timeout: float | None = None,
             wait_for_ready: bool | None = None, retry: Retry | None = None,
             error: Callable[[grpc.RpcError], Exception] | None = None) -> Any:
        """Make one call and return its reply (the list of replies, for a method whose replies stream).

        Args:
            method: the method's name.
            request: the request message; for a method whose requests stream, a function returning
                a fresh iterator of them (an attempt made again sends them again).
            timeout: the call's deadline, in seconds (None: none).
            wait_for_ready: wait for the channel to connect instead of failing at once while it cannot.
            retry: which failures are tried again (None: none).
            error: turns a failure not tried again into the error raised (None: the `grpc.RpcError`).

        Raises:
            Cancelled: `cancel_in_flight` cancelled the call.
        """
        streaming = self.service[method].streams_replies
        while True:
            if retry is not None:
                retry.before()
            try:
                return self._once(method, request, streaming, timeout, wait_for_ready)
            except grpc.RpcError as exc:
                if retry is not None and exc.code() in retry.codes and retry.again(exc):
                    time.sleep(retry.pause_seconds)
                    continue
                if error is None:
                    raise
                raise error(exc) from None

    def _once(self, method: str, request: Message | Callable[[], Iterator[Message]], streaming: bool,
              timeout: float | None, wait_for_ready: bool | None) -> Any:
        requests = request() if self.service[method].streams_requests else request
        target = self._callables[method]
        with self._lock:  # started and recorded at once: a cancel seeing the call at the server sees it here too
            if streaming:
                call = target(requests, metadata=self.metadata, timeout=timeout, wait_for_ready=wait_for_ready)
            else:
                call = target.future(requests, metadata=self.metadata, timeout=timeout, wait_for_ready=wait_for_ready)
            self._in_flight.add(call)
        try:
            return list(call) if streaming else call.result()
        except grpc.FutureCancelledError:
            raise Cancelled(f"{method} was cancelled by this process") from None
        finally:
            with self._lock:
                self._in_flight.discard(call)

    def cancel_in_flight(self) -> int:
        """Cancel every call of `call` still waiting for its answer (they raise in their threads); return how many."""
        with self._lock:
            waiting = list(self._in_flight)
        for call in waiting:
            call.cancel()
        return len(waiting)
