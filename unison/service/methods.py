"""The coordinator service's method table, as rank 0's server and every rank's client know it.

``Register`` announces a rank; ``Negotiate`` is a rank's one stream of control-plane exchanges for
the job; ``Heartbeats`` its stream of heartbeats (``Heartbeat``, one beat per call, is served too);
``Status`` the live table of ``unisonrun --status``; ``Abort`` a rank's request to stop the job.
`unison.rpc` registers and calls it; the messages are `coordinator_pb2`'s (``coordinator.proto``).
"""

from __future__ import annotations

from ..rpc.methods import Method, Reading, Service
from . import coordinator_pb2 as pb

__all__ = ["ABORT_TOLD_SECONDS", "COORDINATOR", "RANKS_KEY", "RANK_KEY"]

RANK_KEY = "x-unison-rank"
# On a Negotiate stream: the ranks it speaks for ("0,1,2,3": a host leader and its host's ranks);
# absent, just RANK_KEY's rank.
RANKS_KEY = "x-unison-ranks"
# An Abort call is answered once every rank knows why, or after this long (its caller waits 2 s more).
ABORT_TOLD_SECONDS = 3.0

COORDINATOR = Service(
    "unison.v1.Coordinator",
    (
        Method("Register", pb.RegisterRequest, pb.RegisterReply),
        Method("Negotiate", pb.Exchange, pb.ExchangeReply, Reading.STREAM, streams_replies=True),
        Method("Heartbeat", pb.HeartbeatRequest, pb.HeartbeatReply),
        Method("Heartbeats", pb.HeartbeatRequest, pb.HeartbeatReply, Reading.STREAM, streams_replies=True),
        Method("Status", pb.StatusRequest, pb.StatusReply),
        Method("Abort", pb.AbortRequest, pb.AbortReply),
    ),
    hint="the caller speaks another protocol or corrupted its message. Every rank of a job must run the same "
         "unison version.",
)
