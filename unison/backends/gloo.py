"""A transport over torch's gloo: every exchange of the Backend contract on a gloo process group.

For jobs without MPI (a job launched by torchrun): the ranks meet through a torch store, and gloo,
torch's own maintained CPU transport, carries the bytes. NumPy buffers are handed to gloo as torch
tensors over the same memory (``torch.from_numpy``), so nothing is copied on the way in or out.
gloo has no 16-bit integers and no unsigned type but uint8: what only moves (gathers, broadcasts,
all-to-alls, half-precision pieces) travels as a type of the same width that gloo has, bit for bit
(2-byte values as float16, which gloo copies without reading); what is reduced is widened where the
bits alone would not reduce alike (16-bit integers and uint32 in int32 and int64 copies). Waits poll the work, so `abandon` can end them. Each process set is a gloo group
of its members, made from the store under a prefix of its own.

Liveness: each rank's heartbeat thread advances a counter in the store every `HEARTBEAT_SECONDS`. A
wait that lasts `peer_timeout_seconds`, or that gloo ends with an error (a peer's connection closed),
reads the counters twice, `probe_window` apart: a peer whose counter did not move is frozen or gone,
and the wait raises `AbortedError` naming it, as the MPI transport's liveness probe does.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AbortedError
from ..ops import ReduceOp
from ..protocol.partition import split_counts
from ._liveness import probe_window
from .base import Abandoned

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Work

__all__ = ["GlooBackend", "GlooWorld"]

_SPIN_SECONDS = 0.0002  # a wait spins this long before it starts to sleep
# A large allreduce's chunks started at once: gloo runs them on its threads side by side (one after
# another, each waited for, a 46 MB allreduce took 83 ms against 43 ms for one call of torch's gloo).
_IN_FLIGHT = 4
_MAX_SLEEP_SECONDS = 0.002
HEARTBEAT_SECONDS = 0.5
_CLOSE_JOIN_SECONDS = 2.0  # a heartbeat's store call that outlasts this (the store is gone) is left behind
_PROBE_STEP_SECONDS = 0.01  # the liveness probe's wait looks this often whether the transport was abandoned
_RETIRED: list[Any] = []  # closed backends' gloo groups (see GlooBackend.close)
# same width, a type gloo has: for buffers that are only moved
_STAND_INS = {np.dtype(np.uint64): np.int64, np.dtype(np.uint32): np.int32, np.dtype(np.uint16): np.float16,
              np.dtype(np.int16): np.float16, np.dtype(np.bool_): np.uint8}
# for buffers that are reduced: wider copies where the same bits would not reduce alike (MIN and MAX of
# unsigned values, any 16-bit integer); uint64 keeps its int64 bits (sums and products wrap alike, MIN
# and MAX of values over 2**63 do not: documented)
_WIDER = {np.dtype(np.uint32): np.int64, np.dtype(np.uint16): np.int32, np.dtype(np.int16): np.int32}


@dataclasses.dataclass(frozen=True)
class GlooWorld:
    """Where the ranks meet: a torch store every rank reaches, this rank, the job's size."""

    store: Any  # a torch Store; its stubs take str values where gloo's callers pass bytes
    rank: int
    size: int
    timeout_seconds: float = 1800.0
    peer_timeout_seconds: float = 0.0  # 0: no liveness checks (a test's second backend)


class GlooBackend:
    """The Backend contract over gloo groups made from one torch store."""

    name = "gloo"
    reduces_status = True

    def __init__(self, world: GlooWorld, chunk_bytes: int = 4 * 1024 * 1024) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.rank, self.size = world.rank, world.size
        self._world = world
        self._chunk_bytes = chunk_bytes
        self._abandoned = False
        # a gloo group: torch's stubs for ProcessGroupGloo lack the collectives used here
        self._groups: dict[int, Any] = {0: self._group(0, list(range(world.size)))}
        self._members: dict[int, list[int]] = {0: list(range(world.size))}
        # torch's stubs leave the type of ReduceOp.SUM and its kin (ReduceOp.RedOpType) undefined
        self._ops: dict[ReduceOp, Any] = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MIN: dist.ReduceOp.MIN,
                     ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
        self._band: Any = dist.ReduceOp.BAND
        self._stats = {"control_calls": 0, "data_calls": 0, "data_bytes": 0, "wait_seconds": 0.0}
        self._beats = 0
        self._closed = threading.Event()
        self._beating: threading.Thread | None = None
        if world.peer_timeout_seconds > 0 and world.size > 1:
            self._beating = threading.Thread(target=self._heartbeat, name="unison-gloo-heartbeat", daemon=True)
            self._beating.start()

    def __repr__(self) -> str:
        return f"<GlooBackend rank={self.rank} size={self.size} sets={sorted(self._groups)}>"

    def _group(self, set_id: int, ranks: list[int]) -> Any:
        dist = self._dist
        store = dist.PrefixStore(f"unison.gloo.set{set_id}", self._world.store)
        rank = ranks.index(self.rank)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=self._world.timeout_seconds)
        options._devices = [dist.ProcessGroupGloo.create_default_device()]
        return dist.ProcessGroupGloo(store, rank, len(ranks), options)

    # -- waiting -------------------------------------------------------------------------------

    def _wait(self, work: Work) -> None:
        """Wait for a gloo work, polling so that `abandon` ends the wait; name a lost peer; raise gloo's error."""
        start = time.perf_counter()
        sleep = 0.0
        timeout = self._world.peer_timeout_seconds
        checked_at = start
        while not work.is_completed():
            if self._abandoned:
                raise Abandoned()
            now = time.perf_counter()
            if now - start > _SPIN_SECONDS:
                sleep = min(_MAX_SLEEP_SECONDS, sleep * 2 or 0.00005)
                time.sleep(sleep)
            if timeout > 0 and now - checked_at > timeout:
                self._check_peers(now - start)
                checked_at = time.perf_counter()
        try:
            work.wait()
        except RuntimeError:
            if timeout > 0:
                self._check_peers(time.perf_counter() - start)
            raise
        self._stats["wait_seconds"] += time.perf_counter() - start

    def _heartbeat(self) -> None:
        key = f"unison.alive.{self.rank}"
        while not self._closed.wait(HEARTBEAT_SECONDS):
            try:
                self._beats = self._world.store.add(key, 1)
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return

    def _counters(self) -> dict[int, int]:
        store = self._world.store
        return {r: store.add(f"unison.alive.{r}", 0) for r in range(self.size) if r != self.rank}

    def _check_peers(self, waited_seconds: float) -> None:
        """Raise AbortedError naming the peers whose heartbeat stopped (frozen or gone); return if all beat."""
        window = max(probe_window(self._world.peer_timeout_seconds), 2 * HEARTBEAT_SECONDS)
        before = self._counters()
        until = time.monotonic() + window
        while time.monotonic() < until:  # abandoned meanwhile (an elastic epoch ended): no verdict needed
            if self._abandoned:
                raise Abandoned()
            time.sleep(min(_PROBE_STEP_SECONDS, max(0.0, until - time.monotonic())))
        after = self._counters()
        lost = [r for r in sorted(before) if after[r] == before[r]]
        if not lost:
            return
        who = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {lost}"
        raise AbortedError(
            f"{who} stopped answering: rank {self.rank} waited {waited_seconds:.0f} s for {who} and {who} sent "
            f"no heartbeat for {window:g} s. The process is frozen (stopped by a signal, a debugger), dead, or "
            "its host is unreachable. Stopping the job (UNISON_PEER_TIMEOUT_SECONDS)."
        )

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """The buffer as a torch tensor on its memory; gloo's missing types as a type of their width."""
        stand_in = _STAND_INS.get(array.dtype)
        return self._torch.from_numpy(array.view(stand_in) if stand_in is not None else array)

    # -- control plane -------------------------------------------------------------------------

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        self._stats["control_calls"] += 1
        row = np.ascontiguousarray(row, dtype=np.uint64)
        out = np.empty((self.size, row.size), dtype=np.uint64)
        self._wait(self._groups[0]._allgather_base(self._tensor(out.reshape(-1)), self._tensor(row)))
        return out

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        return self.allgather_status(row)  # the slow path's gather needs every rank's length everywhere

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        self._stats["control_calls"] += 1
        out = np.ascontiguousarray(vector, dtype=np.uint64).copy()
        options = self._dist.AllreduceOptions()
        options.reduceOp = self._band  # on int64: the same bits as on uint64
        self._wait(self._groups[0].allreduce([self._tensor(out)], options))
        return out

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        self._stats["control_calls"] += 1
        counts = [int(n) for n in lengths]
        recv = np.empty(sum(counts), dtype=np.uint8)
        self._allgatherv(self._groups[0], np.frombuffer(payload, dtype=np.uint8).copy(), recv, counts)
        if self.rank != 0:
            return None
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(int)
        return [recv[offsets[r]:offsets[r + 1]].tobytes() for r in range(self.size)]

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        self._stats["control_calls"] += 1
        length = np.array([len(payload) if self.rank == 0 and payload is not None else 0], dtype=np.int64)
        self._broadcast(length, 0, 0)
        buf = (np.frombuffer(payload, dtype=np.uint8).copy() if self.rank == 0 and payload is not None
               else np.empty(int(length[0]), dtype=np.uint8))
        self._broadcast(buf, 0, 0)
        return buf.tobytes()  # control traffic: counted in control_calls, not in the data plane's bytes

    # -- data plane ----------------------------------------------------------------------------

    def _chunk_elements(self, buf: np.ndarray) -> int:
        if self._chunk_bytes <= 0 or buf.size == 0:
            return max(buf.size, 1)
        return max(1, self._chunk_bytes // buf.itemsize)

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        """Reduce `buf` in chunks, `_IN_FLIGHT` of them started at a time (gloo's threads run them side by
        side), finished in order: `after_chunk` sees each chunk once it is reduced, in order."""
        group = self._groups[process_set_id]
        step = self._chunk_elements(buf)
        options = self._dist.AllreduceOptions()
        options.reduceOp = self._ops[op]
        wider = _WIDER.get(buf.dtype)
        started: collections.deque[tuple[Work, np.ndarray, np.ndarray | None]] = collections.deque()
        for start in range(0, buf.size, step):
            chunk = buf[start:start + step]
            # reduced in a wider copy where needed, written back with the narrow type's wrap-around
            widened = None if wider is None else chunk.astype(wider)
            started.append((group.allreduce([self._tensor(chunk if widened is None else widened)], options),
                            chunk, widened))
            if len(started) == _IN_FLIGHT:
                self._finish_chunk(*started.popleft(), after_chunk)
        while started:
            self._finish_chunk(*started.popleft(), after_chunk)
        self._stats["data_bytes"] += buf.nbytes

    def _finish_chunk(self, work: Work, chunk: np.ndarray, widened: np.ndarray | None,
                      after_chunk: Callable[[np.ndarray], None] | None) -> None:
        self._wait(work)
        if widened is not None:
            chunk[...] = widened.astype(chunk.dtype)
        self._stats["data_calls"] += 1
        if after_chunk is not None:
            after_chunk(chunk)

    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        group = self._groups[process_set_id]
        members, me = len(self._members[process_set_id]), self._members[process_set_id].index(self.rank)
        step = self._chunk_elements(buf)
        for start in range(0, buf.size, step):
            chunk = buf[start:start + step]
            counts = split_counts(chunk.size, members)
            mine = counts[me]
            recv = np.empty((members, mine), dtype=buf.dtype)
            self._wait(group.alltoall_base(self._tensor(recv.reshape(-1)), self._tensor(chunk), [mine] * members,
                                           counts, self._dist.AllToAllOptions()))
            combined = np.ascontiguousarray(combine(recv), dtype=buf.dtype)
            self._allgatherv(group, combined, chunk, counts)
            self._stats["data_calls"] += 2
        self._stats["data_bytes"] += buf.nbytes

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        self._allgatherv(self._groups[process_set_id], send, recv, [int(c) for c in counts])
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += recv.nbytes

    def _allgatherv(self, group: Any, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        # gloo gathers equal pieces: pad each member's to the longest, then cut
        widest = max(counts) if counts else 0
        if widest == 0:
            return
        padded = np.zeros(widest, dtype=send.dtype)
        padded[:send.size] = send
        out = np.empty(widest * len(counts), dtype=send.dtype)
        self._wait(group._allgather_base(self._tensor(out), self._tensor(padded)))
        offset = 0
        for index, count in enumerate(counts):
            recv[offset:offset + count] = out[index * widest:index * widest + count]
            offset += count

    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        self._broadcast(buf, root, process_set_id)
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += buf.nbytes

    def _broadcast(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        options = self._dist.BroadcastOptions()
        options.rootRank = root
        if buf.size:
            self._wait(self._groups[process_set_id].broadcast([self._tensor(buf)], options))

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        self._wait(self._groups[process_set_id].alltoall_base(
            self._tensor(recv), self._tensor(send), [int(c) for c in recv_counts], [int(c) for c in send_counts],
            self._dist.AllToAllOptions()))
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += send.nbytes

    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        # an allreduce of the whole buffer, each member keeping its rows: exact, twice the bytes
        whole = send.copy()
        self.allreduce_(whole, op, process_set_id)
        me = self._members[process_set_id].index(self.rank)
        start = sum(int(c) for c in recv_counts[:me])
        recv[:] = whole[start:start + int(recv_counts[me])]

    # -- process sets, lifecycle ---------------------------------------------------------------

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        members = sorted(int(r) for r in ranks)
        if self.rank in members:
            self._groups[process_set_id] = self._group(process_set_id, members)
            self._members[process_set_id] = members

    def remove_process_set(self, process_set_id: int) -> None:
        if process_set_id != 0:
            self._groups.pop(process_set_id, None)
            self._members.pop(process_set_id, None)

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        self._chunk_bytes = chunk_bytes

    def abandon(self) -> None:
        self._abandoned = True

    def close(self) -> None:
        self._closed.set()
        # A daemon thread still inside torch's C++ (the heartbeat's store call) when the interpreter
        # finalizes is unwound through code that cannot be, and the process ends with SIGABRT
        # ("terminate called without an active exception"): the heartbeat ends before the process does.
        if self._beating is not None and self._beating is not threading.current_thread():
            self._beating.join(_CLOSE_JOIN_SECONDS)
        # A gloo group's destructor waits for its pending work, which may involve a frozen peer:
        # the groups are kept until the process ends instead (a broken job ends with os._exit).
        _RETIRED.extend(self._groups.values())
        self._groups = {}

    def statistics(self) -> dict[str, float]:
        return dict(self._stats)
