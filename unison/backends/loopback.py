"""In-memory backends: a single-process job, and N ranks as threads of one process (for tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import numpy as np

from ..ops import ReduceOp
from ..protocol.partition import split_counts

__all__ = ["LoopbackBackend", "ThreadBackend", "ThreadGroup"]

_T = TypeVar("_T")


class LoopbackBackend:
    """Backend for a job of size 1 (no MPI needed): reductions are identities, gathers are copies."""

    name = "loopback"
    reduces_status = True

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self._calls = 0

    def __repr__(self) -> str:
        return "<LoopbackBackend size=1>"

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        self._calls += 1
        return row.reshape(1, -1).copy()

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        self._calls += 1
        return vector.copy()

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        return self.allgather_status(row)

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        return [payload]

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        return payload or b""

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        self._calls += 1
        if after_chunk is not None:
            after_chunk(buf)

    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        self._calls += 1
        buf[...] = combine(buf.reshape(1, -1))

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

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        return None  # one process: nothing is reduced over a transport

    def abandon(self) -> None:
        return None

    def close(self) -> None:
        return None

    def statistics(self) -> dict[str, float]:
        return {"calls": self._calls, "wait_seconds": 0.0}


class _Rendezvous:
    """Exchange one value per member among threads (two barrier phases per exchange)."""

    def __init__(self, size: int) -> None:
        self.slots: list[object] = [None] * size
        self.barrier = threading.Barrier(size)

    def exchange(self, index: int, value: _T) -> list[_T]:
        from .base import Abandoned

        try:
            self.slots[index] = value
            self.barrier.wait()
            result = cast("list[_T]", list(self.slots))  # every member passes the same kind of value
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise Abandoned() from None
        return result


_NUMPY_OPS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


class ThreadGroup:
    """N in-process ranks for tests: each thread gets a backend from `backend(rank)`.

    Example:
        >>> group = ThreadGroup(2)
        >>> group.backend(1).size
        2
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._sets: dict[int, tuple[tuple[int, ...], _Rendezvous]] = {
            0: (tuple(range(size)), _Rendezvous(size))
        }
        self._control = _Rendezvous(size)

    def backend(self, rank: int) -> ThreadBackend:
        """The backend for one rank."""
        return ThreadBackend(self, rank)

    def _set(self, process_set_id: int) -> tuple[tuple[int, ...], _Rendezvous]:
        return self._sets[process_set_id]

    def _add(self, process_set_id: int, ranks: Sequence[int]) -> None:
        with self._lock:
            if process_set_id not in self._sets:
                self._sets[process_set_id] = (tuple(sorted(ranks)), _Rendezvous(len(ranks)))

    def abandon(self) -> None:
        self._control.barrier.abort()
        for _, rendezvous in self._sets.values():
            rendezvous.barrier.abort()


class ThreadBackend:
    """One rank of a `ThreadGroup`; semantics match the MPI backend, data moves through memory."""

    name = "threads"
    reduces_status = True

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.size = group.size
        self._calls = 0

    def __repr__(self) -> str:
        return f"<ThreadBackend rank={self.rank} size={self.size}>"

    def _exchange(self, process_set_id: int, value: _T) -> tuple[list[_T], int]:
        members, rendezvous = self.group._set(process_set_id)
        index = members.index(self.rank)
        self._calls += 1
        return rendezvous.exchange(index, value), index

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        self._calls += 1
        return np.stack(self.group._control.exchange(self.rank, row.copy()))

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        self._calls += 1
        return np.bitwise_and.reduce(np.stack(self.group._control.exchange(self.rank, vector.copy())), axis=0)

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        matrix = self.allgather_status(row)
        return matrix if self.rank == 0 else None  # as MPI's gather: the rows at rank 0 only

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        values = self.group._control.exchange(self.rank, payload)
        return [bytes(v) for v in values] if self.rank == 0 else None

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        values = self.group._control.exchange(self.rank, payload)
        return bytes(cast(bytes, values[0]))  # rank 0, the root, passes the payload

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        values, _ = self._exchange(process_set_id, buf.copy())
        result = values[0].copy()
        for value in values[1:]:
            _NUMPY_OPS[op](result, value, out=result)
        buf[...] = result
        if after_chunk is not None:
            after_chunk(buf)

    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        members, _ = self.group._set(process_set_id)
        counts = split_counts(buf.size, len(members))
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(int)
        values, index = self._exchange(process_set_id, buf.copy())
        mine = np.stack([v[offsets[index] : offsets[index + 1]] for v in values])
        pieces, _ = self._exchange(process_set_id, np.asarray(combine(mine), dtype=buf.dtype))
        buf[...] = np.concatenate(pieces)

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        values, _ = self._exchange(process_set_id, send.copy())
        recv[...] = np.concatenate(values)

    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        values, _ = self._exchange(process_set_id, buf.copy())
        buf[...] = values[root]

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        offsets = np.concatenate(([0], np.cumsum(send_counts))).astype(int)
        pieces = [send[offsets[i] : offsets[i + 1]].copy() for i in range(len(send_counts))]
        values, index = self._exchange(process_set_id, pieces)
        recv[...] = np.concatenate([v[index] for v in values])

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        total = send.copy()
        self.allreduce_(total, op, process_set_id)
        members, _ = self.group._set(process_set_id)
        index = members.index(self.rank)
        start = int(sum(recv_counts[:index]))
        recv[...] = total[start : start + recv_counts[index]]

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        self.group._add(process_set_id, ranks)

    def remove_process_set(self, process_set_id: int) -> None:
        return None

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        return None  # threads reduce each buffer whole

    def abandon(self) -> None:
        self.group.abandon()

    def close(self) -> None:
        return None

    def statistics(self) -> dict[str, float]:
        return {"calls": self._calls, "wait_seconds": 0.0}
