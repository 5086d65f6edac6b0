"""The server's side of a method table: every method reads raw frames, parsed in its handler.

Every method is registered as a stream of raw bytes and its messages are parsed here. A message that
is not valid protobuf then fails its call with ``INVALID_ARGUMENT`` from the handler itself; gRPC's
own deserializer failure raced with the handler's end and could leave the call unfinished, which
made ``server.stop()`` wait forever. Registered so, every method can stand behind `gate.Gate`, which
counts a call until its behaviour ends.

A behaviour receives what its method's `Reading` says (the request; an iterator of requests; the
list of them) and the gRPC context, and returns the reply or yields the replies. It refuses its call
by raising `Refused` or one of its service's `refusals`: the call ends with that status and the
error's text, after `on_refused` has seen it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from .methods import Method, Reading, Refused, Service

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["handlers"]

# Any: a behaviour takes its own method's request type (or an iterator or list of them) and returns its
# reply type (or yields them); one alias covers every method of a table.
Behaviour = Callable[[Any, grpc.ServicerContext], Any]


def _parsed(service: Service, method: Method, raw: Iterable[bytes],
            on_bytes_in: Callable[[int], None] | None) -> Iterator[Message]:
    """Parse each raw message of a call; refuse the call with INVALID_ARGUMENT at the first that is not one."""
    request = method.request
    for index, data in enumerate(raw):
        if on_bytes_in is not None:
            on_bytes_in(len(data))
        try:
            yield request.FromString(data)
        except DecodeError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{method.name}: message {index} ({len(data)} bytes) is not a valid "
                          f"{request.DESCRIPTOR.name} ({exc}); {service.hint}") from None


def _read(service: Service, method: Method, raw: Iterable[bytes],
          on_bytes_in: Callable[[int], None] | None) -> Message | Iterator[Message] | list[Message]:
    """What the behaviour of `method` receives: its reading of the call's messages."""
    messages = _parsed(service, method, raw, on_bytes_in)
    name = method.request.DESCRIPTOR.name
    if method.reading is Reading.STREAM:
        return messages
    if method.reading is Reading.ONE:
        for message in messages:
            return message
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{method.name} takes one {name} message; the call ended without one.")
    every = list(messages)
    if not every:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{method.name}: the call ended without a {name} message.")
    return every


def _handler(service: Service, method: Method, behaviour: Behaviour,
             on_refused: Callable[[str, Exception], None] | None,
             on_bytes_in: Callable[[int], None] | None) -> Behaviour:
    """`behaviour` as a raw-frame handler: its requests read, its refusals turned into the call's status."""

    def refuse(error: Exception, context: grpc.ServicerContext) -> NoReturn:
        if on_refused is not None:
            on_refused(method.name, error)
        context.abort(service.status_of(error), str(error))
        raise AssertionError("unreachable: grpc's abort raises")  # for the type checker

    if method.streams_replies:
        def streams(raw: Iterable[bytes], context: grpc.ServicerContext) -> Iterator[Message]:
            try:
                yield from behaviour(_read(service, method, raw, on_bytes_in), context)
            except service.refused as error:
                refuse(error, context)

        return streams

    def answers(raw: Iterable[bytes], context: grpc.ServicerContext) -> Message:
        try:
            return behaviour(_read(service, method, raw, on_bytes_in), context)
        except service.refused as error:
            refuse(error, context)

    return answers


def handlers(service: Service, behaviours: Mapping[str, Behaviour], *,
             on_refused: Callable[[str, Exception], None] | None = None,
             on_bytes_in: Callable[[int], None] | None = None,
             on_bytes_out: Callable[[int], None] | None = None) -> grpc.GenericRpcHandler:
    """Register `service`'s methods, each run by the behaviour of its name.

    Args:
        service: the method table.
        behaviours: one per method, by name.
        on_refused: called with the method's name and the error before a refused call ends.
        on_bytes_in: called with the size of every request message received.
        on_bytes_out: called with the size of every reply message sent.
    """
    missing = sorted({m.name for m in service.methods} - set(behaviours))
    if missing:
        raise TypeError(f"{service.name}: no behaviour for {missing}")

    def serialize(message: Message) -> bytes:
        data = bytes(message.SerializeToString())
        if on_bytes_out is not None:
            on_bytes_out(len(data))
        return data

    table = {}
    for method in service.methods:
        handler = _handler(service, method, behaviours[method.name], on_refused, on_bytes_in)
        register = (grpc.stream_stream_rpc_method_handler if method.streams_replies
                    else grpc.stream_unary_rpc_method_handler)
        table[method.name] = register(handler, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(service.name, table)
