"""How a call enters the coordinator service: the secret checked and a slot granted before anything else.

Two things here keep callers from holding the service's resources:

- `Gate`, a server interceptor, runs in gRPC's polling thread before a call gets a worker thread. A
  call without the job secret is answered ``UNAUTHENTICATED`` by a handler that reads nothing, so it
  holds no slot and no worker while its sender withholds the rest of the call. Only calls with the
  secret count against the limit of calls served at once (gRPC's own ``maximum_concurrent_rpcs``
  counted every call, which callers without the secret could fill with calls they never finish).
- `method_handlers` registers every method as a stream of raw bytes and parses the messages in the
  handler. A message that is not valid protobuf then fails its call with ``INVALID_ARGUMENT`` from the
  handler itself; gRPC's own deserializer failure raced with the handler's end and could leave the
  call unfinished, which made ``server.stop()`` wait forever. Every method still looks the same on the
  wire (a unary call sends one message on its stream).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from . import coordinator_pb2 as pb
from .security import TOKEN_KEY, token_matches

__all__ = ["SERVICE_NAME", "Gate", "method_handlers"]

SERVICE_NAME = "unison.v1.Coordinator"

# method -> (request type, whether the method takes a stream of requests, whether it answers with a stream)
_METHODS: dict[str, tuple[Any, bool, bool]] = {
    "Register": (pb.RegisterRequest, False, False),
    "Negotiate": (pb.Exchange, True, True),
    "Heartbeat": (pb.HeartbeatRequest, False, False),
    "Heartbeats": (pb.HeartbeatRequest, True, True),
    "Status": (pb.StatusRequest, False, False),
    "Abort": (pb.AbortRequest, False, False),
}


def _refusal(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with `code` at once, without reading any request message."""

    def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    return grpc.stream_stream_rpc_method_handler(refuse)


class Gate(grpc.ServerInterceptor):
    """Admit calls that carry the job secret, at most `limit` at once; refuse the others at once.

    Args:
        secret: the job secret, expected in the call metadata under ``TOKEN_KEY``.
        limit: calls with the secret served at once; one more is refused with ``RESOURCE_EXHAUSTED``.
        service: how the refusal names the service; `why`: what its clients keep open, for the reader.
    """

    def __init__(self, secret: str, limit: int, service: str = "the coordinator service",
                 why: str = "a rank keeps at most two open for the job's lifetime") -> None:
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

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
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

    Only stream-request handlers (every method of `method_handlers`): gRPC calls their behaviour at once,
    whereas a unary-request behaviour is never called when the request message never comes, which would
    leave the slot taken.
    """
    if not handler.request_streaming:
        raise TypeError("the coordinator service registers every method with a stream of requests")
    if handler.response_streaming:
        behaviour = handler.stream_stream

        def streams(requests: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from behaviour(requests, context)
            finally:
                release()

        return grpc.stream_stream_rpc_method_handler(
            streams, handler.request_deserializer, handler.response_serializer)
    single = handler.stream_unary

    def answers(requests: Any, context: grpc.ServicerContext) -> Any:
        try:
            return single(requests, context)
        finally:
            release()

    return grpc.stream_unary_rpc_method_handler(answers, handler.request_deserializer, handler.response_serializer)


def _parsed(method: str, request_type: Any, requests: Iterable[bytes],
            context: grpc.ServicerContext) -> Iterator[Any]:
    """Parse each raw message of a call; end the call with INVALID_ARGUMENT at the first that is not one."""
    for index, raw in enumerate(requests):
        try:
            yield request_type.FromString(raw)
        except DecodeError as exc:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{method}: message {index} ({len(raw)} bytes) is not a valid {request_type.DESCRIPTOR.name} "
                f"({exc}); the caller speaks another protocol or corrupted its message. Every rank of a job "
                "must run the same unison version.",
            )


def _first(method: str, request_type: Any, requests: Iterable[bytes], context: grpc.ServicerContext) -> Any:
    for message in _parsed(method, request_type, requests, context):
        return message
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  f"{method} takes one {request_type.DESCRIPTOR.name} message; the call ended without one.")


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def method_handlers(servicer: Any) -> grpc.GenericRpcHandler:
    """The service's methods, each reading raw request bytes that its handler parses.

    `servicer` has one method per RPC: ``Name(request, context)`` for a unary request, and
    ``Name(requests, context)`` with an iterator of parsed messages for a stream of requests.
    """
    handlers = {}
    for method, (request_type, streaming_request, streaming_response) in _METHODS.items():
        behaviour = getattr(servicer, method)
        if streaming_request:
            def streams(requests: Any, context: grpc.ServicerContext, method: str = method,
                        request_type: Any = request_type, behaviour: Any = behaviour) -> Any:
                return behaviour(_parsed(method, request_type, requests, context), context)

            behave = streams
        else:
            def one(requests: Any, context: grpc.ServicerContext, method: str = method,
                    request_type: Any = request_type, behaviour: Any = behaviour) -> Any:
                return behaviour(_first(method, request_type, requests, context), context)

            behave = one
        if streaming_response:
            handlers[method] = grpc.stream_stream_rpc_method_handler(behave, response_serializer=_serialize)
        else:
            handlers[method] = grpc.stream_unary_rpc_method_handler(behave, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
