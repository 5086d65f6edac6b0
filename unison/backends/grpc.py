"""The gRPC control plane as a Backend: status, gather and broadcast over the coordinator service, data over
MPI (or gloo, in a job torchrun started).

Selected with ``UNISON_CONTROLLER=grpc``. The service itself (rank 0), the client stream and the
heartbeats live in `unison.service`; this module is the seam the engine sees. With host aggregation
each host's lowest rank gathers its host's rows and payloads over MPI shared memory and speaks for
all of them (`docs/service.md`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ops import ReduceOp
from ..service import coordinator_pb2 as pb
from ..service.client import ControlClient
from ..service.rendezvous import pack_parts

if TYPE_CHECKING:
    from ..service.server import CoordinatorServer

__all__ = ["GrpcBackend"]


class GrpcBackend:
    """Control plane over the coordinator service, data plane delegated to another backend (MPI)."""

    reduces_status = False  # every exchange is one round trip to rank 0's service: rows cost no more

    # data: an MpiBackend, or a GlooBackend in a job torchrun started; host aggregation (MPI only)
    # calls the MPI backend's host_* methods, which the Backend protocol does not have
    def __init__(self, control: ControlClient, data: Any, size: int, server: CoordinatorServer | None = None,
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
        self.name = f"grpc+{data.name}"  # grpc+mpi, or grpc+gloo in a job torchrun started

    def __repr__(self) -> str:
        host = f" host_ranks={list(self.host_ranks)}" if self.host_ranks else ""
        return f"<GrpcBackend rank={self.rank} size={self.size}{host} service={self.control.address}>"

    def statistics(self) -> dict[str, float]:
        out = dict(self.data.statistics())
        out["service_sequence_status"] = self.control.exchanges(pb.STATUS)
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

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        return self.allgather_status(row)

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        # One exchange through rank 0's service either way: the engine gathers rows instead
        # (reduces_status is False) and this serves what else asks.
        return np.bitwise_and.reduce(self.allgather_status(vector), axis=0)

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

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        self.data.set_chunk_bytes(chunk_bytes)  # the data plane is MPI's

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
