"""The door of a service: a call's secret checked and a slot granted before the call holds anything.

`Gate`, a server interceptor, runs in gRPC's polling thread before a call gets a worker thread. A
call without the job secret is answered ``UNAUTHENTICATED`` by a handler that reads nothing, so it
holds no slot and no worker while its sender withholds the rest of the call. Only calls with the
secret count against the limit of calls served at once (gRPC's own ``maximum_concurrent_rpcs``
counted every call, which callers without the secret could fill with calls they never finish).
`endpoints.serve` gives a server 8 workers beyond the limit for those refusals (each takes
microseconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import grpc

from .security import TOKEN_KEY, token_matches

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["Gate"]


def _refusal(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with `code` at once, without reading any request message."""

    def refuse(requests: Iterable[bytes], context: grpc.ServicerContext) -> None:
        context.abort(code, details)

    return grpc.stream_stream_rpc_method_handler(refuse)


class Gate(grpc.ServerInterceptor):
    """Admit calls that carry the job secret, at most `limit` at once; refuse the others at once.

    Args:
        secret: the job secret, expected in the call metadata under ``TOKEN_KEY``.
        limit: calls with the secret served at once; one more is refused with ``RESOURCE_EXHAUSTED``.
        service: how the refusal names the service ("the coordinator service").
        why: what its clients keep open, for the reader of the refusal.

    Example:
        >>> gate = Gate("s" * 32, 14, service="the coordinator service", why="a rank keeps two open")
        >>> gate.statistics()
        {'calls_active': 0, 'refused': 0, 'over_limit': 0}
    """

    def __init__(self, secret: str, limit: int, *, service: str, why: str) -> None:
        self._secret = secret
        self.limit = limit
        self._service = service
        self._why = why
        self._lock = threading.Lock()
        self.active = 0  # admitted calls whose handler has not finished
        self.refused = 0  # calls without the secret
        self.over_limit = 0  # calls with the secret refused because `limit` were being served

    def __repr__(self) -> str:
        return f"<Gate active={self.active}/{self.limit} refused={self.refused} over_limit={self.over_limit}>"

    def statistics(self) -> dict[str, int]:
        """Counters: calls being served, calls refused for a missing or wrong secret, calls over the limit."""
        with self._lock:
            return {"calls_active": self.active, "refused": self.refused, "over_limit": self.over_limit}

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None:
            return None  # not a method of the service: gRPC answers UNIMPLEMENTED without a handler
        metadata = dict(details.invocation_metadata or ())
        if not token_matches(metadata.get(TOKEN_KEY), self._secret):
            with self._lock:
                self.refused += 1
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job secret")
        with self._lock:
            if self.active >= self.limit:
                self.over_limit += 1
                return _refusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self._service} serves at most {self.limit} calls with the job secret at once and "
                    f"that many are open; {self._why}, so some client with the secret opens calls and "
                    "does not finish them",
                )
            self.active += 1
        return _counted(handler, self._release)

    def _release(self) -> None:
        with self._lock:
            self.active -= 1


def _counted(handler: grpc.RpcMethodHandler, release: Callable[[], None]) -> grpc.RpcMethodHandler:
    """`handler`, calling `release` once its behaviour has finished.

    Only stream-request handlers (every method `handlers.handlers` registers): gRPC calls their
    behaviour at once, whereas a unary-request behaviour is never called when the request message
    never comes, which would leave the slot taken.
    """
    if not handler.request_streaming:
        raise TypeError("a service behind the gate registers every method with a stream of requests")
    if handler.response_streaming:
        behaviour = handler.stream_stream

        def streams(requests: Iterable[bytes], context: grpc.ServicerContext) -> Iterator[Message]:
            try:
                yield from behaviour(requests, context)
            finally:
                release()

        return grpc.stream_stream_rpc_method_handler(
            streams, handler.request_deserializer, handler.response_serializer)
    single = handler.stream_unary

    def answers(requests: Iterable[bytes], context: grpc.ServicerContext) -> Message:
        try:
            return single(requests, context)
        finally:
            release()

    return grpc.stream_unary_rpc_method_handler(answers, handler.request_deserializer, handler.response_serializer)
