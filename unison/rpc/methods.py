"""How a service of unison declares its method table: one `Service`, read by both ends.

A `Service` names the gRPC service and lists its `Method`s: each method's request and reply message
types, how the caller sends requests and the handler reads them (`Reading`), and whether the service
answers with a stream. `handlers.handlers` registers the table on a server, `stub.Stub` calls it on
a channel; no generated servicer or stub module is needed. Every method travels as a stream of raw
protobuf frames on the server's side, whatever the caller sends: a single request is one message on
its stream, so the wire is the same as with gRPC's unary methods.

A service also lists the errors its handlers raise to refuse a call, each with the status the call
ends with (`refusals`); the caller's side translates the status back into the error it raises.

Example:
    >>> from google.protobuf.empty_pb2 import Empty
    >>> service = Service("demo.v1.Demo", (Method("Ping", Empty, Empty), Method("Pings", Empty, Empty,
    ...                   Reading.STREAM, streams_replies=True)), hint="every rank must run the same unison version.")
    >>> service.path("Ping"), service["Pings"].streams_requests
    ('/demo.v1.Demo/Ping', True)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import grpc

from ..ops import TextEnum

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["Method", "Reading", "Refused", "Service"]


class Reading(TextEnum):
    """How a caller sends a method's requests, and how its handler reads them."""

    ONE = "one"  # one message (a unary request); the handler gets it
    STREAM = "stream"  # a stream, read by the handler as it comes (a long-lived exchange)
    ALL = "all"  # a stream of frames, read whole before the handler runs (at least one)


@dataclasses.dataclass(frozen=True)
class Method:
    """One method of a service: its name, message types, how requests travel, whether replies stream."""

    name: str
    request: type[Message]
    reply: type[Message]
    reading: Reading = Reading.ONE
    streams_replies: bool = False

    @property
    def streams_requests(self) -> bool:
        """Whether the caller sends its requests as a stream (every reading but ONE)."""
        return self.reading is not Reading.ONE


class Refused(Exception):
    """A handler refuses its call: the call ends with `code` and the message as its details."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Service:
    """A gRPC service: its full name, its methods, and how its refusals travel.

    Args:
        name: the service's full name (``unison.v1.Coordinator``).
        methods: its methods.
        hint: the end of the refusal of a message that is not a valid request: what its sender should
            check.
        refusals: errors a handler may raise besides `Refused`, each with the status that ends the
            call; the first that matches wins, so a subclass comes before its base.
    """

    name: str
    methods: tuple[Method, ...]
    hint: str
    refusals: tuple[tuple[type[Exception], grpc.StatusCode], ...] = ()

    def __getitem__(self, method: str) -> Method:
        for candidate in self.methods:
            if candidate.name == method:
                return candidate
        raise KeyError(f"{self.name} has no method {method!r}; its methods: {[m.name for m in self.methods]}")

    def path(self, method: str) -> str:
        """The method's path on the wire."""
        return f"/{self.name}/{self[method].name}"

    @property
    def refused(self) -> tuple[type[Exception], ...]:
        """Every error that ends a call with a status of the service's choosing."""
        return (Refused, *(error for error, _ in self.refusals))

    def status_of(self, error: Exception) -> grpc.StatusCode:
        """The status that ends a call refused with `error` (one of `refused`)."""
        if isinstance(error, Refused):
            return error.code
        for kind, code in self.refusals:
            if isinstance(error, kind):
                return code
        raise TypeError(f"{type(error).__name__} is not one of {self.name}'s refusals")
