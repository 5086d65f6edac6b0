"""The parameter server's method table, as a server and its trainers know it, with the status each refusal travels as.

Every method takes a stream of frames (a large tensor travels as several), read whole before the
server acts; ``Pull`` answers with a stream of frames, the others with one message. The messages are
`ps_pb2`'s (``ps.proto``); `unison.rpc` registers and calls the table.

A refusal of the shard ends its call with a status, and the trainer raises the error it stands for
(`client.Client`): `NotDeclaredError` ``NOT_FOUND``, `ConflictError` ``FAILED_PRECONDITION``, another
`RequestError` (a malformed request, a full table) ``INVALID_ARGUMENT``: each a `RequestError` on the
trainer; `TrainerLostError` ``ABORTED``: a `TrainerLostError`.
"""

from __future__ import annotations

import grpc

from ..errors import ConflictError, InvalidArgumentError, NotDeclaredError, TrainerLostError
from ..rpc.methods import Method, Reading, Service
from . import ps_pb2 as pb

__all__ = ["PARAMETER_SERVER"]

PARAMETER_SERVER = Service(
    "unison.ps.v1.ParameterServer",
    (
        Method("Hello", pb.TrainerInfo, pb.HelloReply, Reading.ALL),
        Method("Heartbeat", pb.TrainerInfo, pb.Ack, Reading.ALL),
        Method("Finish", pb.TrainerInfo, pb.Ack, Reading.ALL),
        Method("Declare", pb.Frame, pb.Ack, Reading.ALL),
        Method("Pull", pb.Frame, pb.Frame, Reading.ALL, streams_replies=True),
        Method("Push", pb.Frame, pb.Ack, Reading.ALL),
        Method("Status", pb.StatusRequest, pb.StatusReply, Reading.ALL),
        Method("Checkpoint", pb.CheckpointRequest, pb.CheckpointReply, Reading.ALL),
    ),
    hint="every process of a job must run the same unison version.",
    refusals=(
        (NotDeclaredError, grpc.StatusCode.NOT_FOUND),
        (ConflictError, grpc.StatusCode.FAILED_PRECONDITION),
        (TrainerLostError, grpc.StatusCode.ABORTED),
        (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),  # a malformed request, a table full, a bad optimizer
    ),
)
