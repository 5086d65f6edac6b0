"""The interface every backend implements: the control-plane exchanges and the data-plane collectives.

Buffers are 1-D, contiguous NumPy arrays; counts are in elements. Reductions receive only SUM, MIN,
MAX or PRODUCT (Average is Sum plus scaling, done by the executor) and never half-precision buffers
(those travel as raw 2-byte values through `allreduce_pieces_`, with the arithmetic in the executor).
Process sets are addressed by id; a backend keeps one communicator per set this rank belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..ops import ReduceOp

__all__ = ["Abandoned", "Backend"]


class Abandoned(Exception):
    """Raised inside the engine thread when a wait was abandoned because the process is giving up."""


class Backend(Protocol):
    """What the engine needs from a transport."""

    name: str
    rank: int
    size: int
    # Whether `reduce_status` costs less than `allgather_status` here: the engine then reduces a
    # summary each cycle and gathers rows only when it needs them (`unison.protocol.cycle`); a
    # backend whose every exchange costs one round trip to one server (the gRPC control plane)
    # gathers rows every cycle and reads the summary from them.
    reduces_status: bool

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        """Exchange one uint64 status row per rank; return the (size, len(row)) matrix."""

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        """Return the bitwise AND of every rank's uint64 `vector` (the same length on every rank)."""

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        """Gather one uint64 status row per rank to rank 0: the (size, len(row)) matrix there; other
        ranks get None, or the matrix where the transport gathers to every rank anyway."""

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        """Gather every rank's payload to rank 0; others get None. `lengths` (every rank's payload length)
        are those `gather_status` gave: at rank 0 always, elsewhere only where it gathers to every rank."""

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Broadcast rank 0's payload to every rank.

        Called once after each `gather_bytes`, in the same cycle: a control plane may deliver the
        broadcast as the answer to the gather (the gRPC service does).
        """

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        """Reduce `buf` in place across the set's members.

        `after_chunk`, if given, is called on each reduced piece while it is still in cache (the
        executor scales there, saving a separate pass over the whole buffer).
        """

    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        """Reduce `buf` in place by pieces, moving bytes only: the reduction itself is `combine`'s.

        Each chunk is split into one piece per member (`unison.protocol.partition.split_counts`); member i receives piece i of
        every member (an alltoall), calls ``combine(matrix)`` on that (members, piece) matrix in
        set-rank order, and the combined pieces are allgathered back into `buf`. Every member ends
        with the same bytes. Used for half precision: the wire carries 2-byte values while `combine`
        sums in float32 and rounds once.
        """

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        """Concatenate each member's `send` (counts[i] elements from set rank i) into `recv`."""

    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        """Overwrite `buf` on every member with set rank `root`'s."""

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        """Send send_counts[i] elements to set rank i and receive recv_counts[i] from it."""

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        """Reduce `send` across members and leave set rank i's recv_counts[i] elements in `recv`."""

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        """Create the set's communicator; collective over every rank of the job."""

    def remove_process_set(self, process_set_id: int) -> None:
        """Free the set's communicator (local)."""

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        """Split later data-plane reductions into calls of about `chunk_bytes` (0: whole buffers).

        Only how a buffer is cut into calls changes, never a result; a backend that does not
        chunk ignores it. The autotuner's knob.
        """

    def abandon(self) -> None:
        """Make any current or future control-plane wait raise `Abandoned`."""

    def close(self) -> None:
        """Release communicators."""

    def statistics(self) -> dict[str, float]:
        """Counters: calls, bytes, seconds spent waiting for peers."""
