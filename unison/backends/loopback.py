"""A single-process backend: the job is this process alone, so every collective is a local copy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ops import ReduceOp

__all__ = ["LoopbackBackend"]


class LoopbackBackend:
    """Backend for a job of size 1 (no MPI needed): reductions are identities, gathers are copies."""

    name = "loopback"

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self._calls = 0

    def __repr__(self) -> str:
        return "<LoopbackBackend size=1>"

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        self._calls += 1
        return row.reshape(1, -1).copy()

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        return [payload]

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        return payload or b""

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int) -> None:
        self._calls += 1

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        recv[: send.size] = send

    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        return None

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        recv[: recv_counts[0]] = send[: send_counts[0]]

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        recv[:] = send[: recv_counts[0]]

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        return None

    def remove_process_set(self, process_set_id: int) -> None:
        return None

    def abandon(self) -> None:
        return None

    def close(self) -> None:
        return None

    def statistics(self) -> dict[str, float]:
        return {"calls": self._calls, "wait_seconds": 0.0}
