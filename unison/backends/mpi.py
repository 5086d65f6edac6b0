"""The MPI backend (mpi4py): control-plane exchanges that wait without spinning, and chunked data-plane calls.

Waiting for peers uses nonblocking requests polled briefly with ``sched_yield`` and then with sleeps
that back off to 1 ms: MPICH's blocking calls busy-poll a core for as long as a peer is late, while
``time.sleep`` costs about 90 us here, too slow for the common case where the peer is microseconds
away. Data-plane calls are made only once negotiation has shown every member is ready, so they are
blocking (fastest) and split into chunks: a 64 MiB buffer reduced in place as 4 MiB chunks ran 2.5x
faster than one call on these machines (cache effects).

Hierarchical allreduce (``UNISON_HIERARCHICAL_ALLREDUCE``, Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``)
reduces each chunk within the host to its local rank 0, allreduces across hosts among the local rank
0s only, and broadcasts the result within the host: one process per host crosses the network instead
of every process. It applies to the global process set of a job that spans several hosts.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

import numpy as np

from ..errors import AbortedError, ConfigError, MissingDependencyError
from ..ops import ReduceOp
from ..protocol.partition import split_counts
from ._liveness import ABSENT_PROBES, Liveness, probe_window
from .base import Abandoned

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["MpiBackend", "abort_with_output", "finalize_mpi", "import_mpi", "initialize_mpi"]


_SPIN_SECONDS = 100e-6
# The slow path's exchanges (a cycle's requests to rank 0, its answer) spin longer: every member has
# just passed the cycle's status exchange, so the answer is a decision away; and MPICH's nonblocking
# collectives move only while their ranks call into MPI, so a waiter asleep also holds up the others.
# Sleeping there after 100 us made a negotiated call take 4.0-4.5 ms at 2 ranks, spinning 1 ms 0.3-0.4 ms.
_IN_CYCLE_SPIN_SECONDS = 1e-3
_FIRST_SLEEP_SECONDS = 50e-6
_MAX_SLEEP_SECONDS = 1e-3


def import_mpi() -> ModuleType:
    """Import mpi4py's MPI module (initializing MPI), or explain how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - exercised only without mpi4py
        raise MissingDependencyError(
            "unison needs mpi4py to run more than one process. Install it with "
            "`pip install mpi4py mpich` (the `mpi` extra of unison: `pip install -e '.[mpi]'` in a checkout)."
        ) from exc
    return MPI


def initialize_mpi(mpi: ModuleType, serialized: bool) -> bool:
    """Start MPI where the application kept mpi4py from doing it (``mpi4py.rc.initialize = False``).

    Horovod initializes MPI itself when it is not initialized yet, and some scripts and Horovod's own
    tests rely on that. The thread level is the one unison asks mpi4py for otherwise:
    ``MPI_THREAD_MULTIPLE``, or ``MPI_THREAD_SERIALIZED`` with ``UNISON_MPI_THREADS_DISABLE``.

    Returns:
        True when this call initialized MPI (the caller then finalizes it, `finalize_mpi`); False
        when MPI already ran (mpi4py's default, or the application's own ``MPI.Init_thread``).

    Raises:
        ConfigError: MPI was already finalized in this process; it cannot start again.
    """
    if mpi.Is_initialized():
        return False
    if mpi.Is_finalized():
        raise ConfigError(
            "init() needs MPI, which was already finalized in this process (MPI.Finalize() was "
            "called); MPI cannot be started twice. Call unison's init() before finalizing MPI, or "
            "leave MPI's finalization to unison and mpi4py."
        )
    mpi.Init_thread(mpi.THREAD_SERIALIZED if serialized else mpi.THREAD_MULTIPLE)
    return True


def finalize_mpi(mpi: ModuleType) -> None:
    """``MPI_Finalize``, unless MPI is already finalized (the application or mpi4py did it)."""
    if mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


# After the last line is written, the time MPICH's mpiexec gets to forward it before MPI_Abort tears
# its output forwarding down (under load, lines written just before the abort were seen lost).
OUTPUT_DRAIN_SECONDS = 0.3


def abort_with_output(comm: MPI.Comm) -> None:
    """Flush this process's output, give the launcher a moment to forward it, then ``MPI_Abort``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    time.sleep(OUTPUT_DRAIN_SECONDS)
    comm.Abort(1)


def _data_plane(method: Callable[..., None]) -> Callable[..., None]:
    """Record when a data-plane call starts and ends, and its process set, for the liveness watch
    (`Liveness`); `method` takes a ``process_set_id``."""
    at = list(inspect.signature(method).parameters).index("process_set_id") - 1  # in args, after self

    @functools.wraps(method)
    def call(self: MpiBackend, *args: object, **kwargs: object) -> None:
        set_id = self._data_set = cast("int", args[at] if len(args) > at else kwargs["process_set_id"])
        self._data_since = time.monotonic()
        try:
            method(self, *args, **kwargs)
        finally:
            self._data_since = 0.0
        self._data_done[set_id] = self._data_done.get(set_id, 0) + 1

    return call


class MpiBackend:
    """Control and data plane over an mpi4py communicator (duplicated, so user traffic never mixes in)."""

    name = "mpi"
    reduces_status = True

    def __init__(self, comm: MPI.Intracomm, chunk_bytes: int, hierarchical: bool = False,
                 peer_timeout_seconds: float = 0.0) -> None:
        self._mpi = import_mpi()
        self._control = comm.Dup()
        self._comms: dict[int, MPI.Comm] = {0: comm.Dup()}
        self.rank = self._control.Get_rank()
        self.size = self._control.Get_size()
        self.chunk_bytes = chunk_bytes
        self._abandoned = False
        self._failure = ""
        self._host: MPI.Comm | None = None
        self._ops: dict[ReduceOp, MPI.Op] = {
            ReduceOp.SUM: self._mpi.SUM,
            ReduceOp.MIN: self._mpi.MIN,
            ReduceOp.MAX: self._mpi.MAX,
            ReduceOp.PRODUCT: self._mpi.PROD,
        }
        self._stats = {"control_calls": 0, "data_calls": 0, "data_bytes": 0, "wait_seconds": 0.0,
                       "hierarchical_calls": 0}
        self._local: MPI.Comm | None = None
        self._cross: MPI.Comm | None = None
        if hierarchical:
            self._split_hosts(comm)
        # Collective like the Dups above: every rank decides the same from the same settings and the
        # same thread level (MPI grants one level to the whole job).
        self._peer_timeout = peer_timeout_seconds
        self._data_since = 0.0  # monotonic start of the data-plane call in progress, 0 when none
        self._data_set = 0  # that call's process set
        self._data_done: dict[int, int] = {}  # process set -> data-plane calls completed on it
        self._control_waits = False  # a control exchange's wait is past its first test (`_wait`)
        self._set_ranks: dict[int, tuple[int, ...]] = {0: tuple(range(self.size))}  # set -> its job ranks
        self._liveness: Liveness | None = None
        if (peer_timeout_seconds > 0 and self.size > 1
                and self._mpi.Query_thread() == self._mpi.THREAD_MULTIPLE):
            self._liveness = Liveness(comm, self._mpi)
            self._liveness.watch_data_plane(lambda: self._data_since, lambda: self._control_waits,
                                            lambda: self._set_ranks.get(self._data_set, ()),
                                            lambda: self._data_set, lambda set_id: self._data_done.get(set_id, 0),
                                            peer_timeout_seconds, self._lost_in_data_plane,
                                            self._absent_from_data_plane)

    def _split_hosts(self, comm: MPI.Intracomm) -> None:
        # Collective over `comm`: every rank makes the same decision from the same gathered sizes.
        local = comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
        is_leader = local.Get_rank() == 0
        cross = comm.Split(0 if is_leader else self._mpi.UNDEFINED, key=comm.Get_rank())
        if local.Get_size() == comm.Get_size():  # the same on every rank: all on one host or not
            local.Free()
            if is_leader:
                cross.Free()
            return  # one host: the flat allreduce already is the local one
        self._local = local
        self._cross = cross if is_leader else None

    def __repr__(self) -> str:
        mode = " hierarchical" if self._local is not None else ""
        return f"<MpiBackend rank={self.rank} size={self.size}{mode} sets={sorted(self._comms)}>"

    def statistics(self) -> dict[str, float]:
        out = dict(self._stats)
        if self._liveness is not None:
            out.update({f"liveness_{k}": float(v) for k, v in self._liveness.statistics().items()})
        return out

    # -- control plane -----------------------------------------------------------------------------

    def _wait(self, request: MPI.Request, spin: float = _SPIN_SECONDS) -> None:
        if request.Test():
            return
        self._control_waits = True  # the liveness answer: this rank waits in a control exchange
        try:
            start = time.perf_counter()
            deadline = start + spin
            while time.perf_counter() < deadline:
                if request.Test():
                    self._stats["wait_seconds"] += time.perf_counter() - start
                    return
                os.sched_yield()
            delay = _FIRST_SLEEP_SECONDS
            next_probe = start + self._peer_timeout if self._liveness is not None else float("inf")
            while not request.Test():
                if self._abandoned:
                    raise Abandoned()
                if self._failure:
                    raise AbortedError(self._failure)
                time.sleep(delay)
                delay = min(delay * 2, _MAX_SLEEP_SECONDS)
                if time.perf_counter() >= next_probe:
                    self._check_peers(time.perf_counter() - start)
                    next_probe = time.perf_counter() + self._peer_timeout
            self._stats["wait_seconds"] += time.perf_counter() - start
        finally:
            self._control_waits = False

    def _lost_in_data_plane(self, lost: list[int], waited_seconds: float) -> None:
        """A peer stopped answering while this rank's engine is blocked in a data-plane call, which no
        Python code can interrupt: say who, then end the job with MPI_Abort (from the watch thread)."""
        who = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {lost}"
        message = (
            f"unison: {who} stopped answering: rank {self.rank} has been in a data-plane collective "
            f"with {who} for {waited_seconds:.0f} s and {who} did not answer a liveness probe within "
            f"{probe_window(self._peer_timeout):g} s (frozen, dead without MPI noticing, or unreachable). A blocked MPI "
            "call cannot be interrupted: ending the job with MPI_Abort (UNISON_PEER_TIMEOUT_SECONDS)."
        )
        self._last_words(message)

    def _last_words(self, message: str) -> None:
        """Write `message` straight to stderr, like the other last words of a rank (unison._job.failure),
        then end the job with MPI_Abort."""
        try:
            sys.stderr.write(message + "\n")
        finally:
            abort_with_output(self._mpi.COMM_WORLD)

    def _absent_from_data_plane(self, absent: list[int], waited_seconds: float) -> None:
        """Peers alive and waiting in a control exchange while this rank's engine is blocked in a
        data-plane call with them: they moved on to their next cycle without joining it (their executor
        failed before the transport, on that rank alone). The blocked call cannot be interrupted: say
        who, then end the job with MPI_Abort."""
        who = f"rank {absent[0]}" if len(absent) == 1 else f"ranks {absent}"
        message = (
            f"unison: {who} never joined a data-plane collective that every member had agreed to run: "
            f"rank {self.rank} has been in it for {waited_seconds:.0f} s, and {who} answered "
            f"{ABSENT_PROBES + 1} liveness probes from a control exchange, without having completed this call "
            f"(the collective most likely failed on {who} alone before it reached the transport: see "
            f"{who}'s output for the error). A blocked MPI call cannot be interrupted: ending the job with "
            "MPI_Abort (UNISON_PEER_TIMEOUT_SECONDS)."
        )
        self._last_words(message)

    def _check_peers(self, waited_seconds: float) -> None:
        """A control exchange has waited `UNISON_PEER_TIMEOUT_SECONDS`: abort if some peer is lost."""
        assert self._liveness is not None
        lost = self._liveness.probe(probe_window(self._peer_timeout))
        if not lost:
            return  # every peer is alive, merely slow (e.g. busy in a long data-plane call)
        who = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {lost}"
        raise AbortedError(
            f"{who} stopped answering: rank {self.rank} waited {waited_seconds:.0f} s for {who} in a "
            f"control exchange and {who} did not answer a liveness probe within "
            f"{probe_window(self._peer_timeout):g} s more. The process is frozen (stopped by a signal, a debugger), "
            "dead without MPI noticing, or its host is unreachable. Stopping the job "
            "(UNISON_PEER_TIMEOUT_SECONDS sets the wait)."
        )

    def allgather_status(self, row: np.ndarray) -> np.ndarray:
        self._stats["control_calls"] += 1
        out = np.empty((self.size, row.size), dtype=row.dtype)
        self._wait(self._control.Iallgather(row, out))
        return out

    def gather_status(self, row: np.ndarray) -> np.ndarray | None:
        self._stats["control_calls"] += 1
        out = np.empty((self.size, row.size), dtype=row.dtype) if self.rank == 0 else None
        self._wait(self._control.Igather(row, out, root=0))
        return out

    def reduce_status(self, vector: np.ndarray) -> np.ndarray:
        self._stats["control_calls"] += 1
        out = np.empty_like(vector)
        self._wait(self._control.Iallreduce(vector, out, op=self._mpi.BAND))
        return out

    def gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        return self._gather_bytes(self._control, payload, lengths)

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        return self._broadcast_bytes(self._control, payload)

    def _gather_bytes(self, comm: MPI.Comm, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        self._stats["control_calls"] += 1
        send = np.frombuffer(payload, dtype=np.uint8)
        byte = self._mpi.BYTE
        if comm.Get_rank() != 0:
            self._wait(comm.Igatherv([send, byte], None, root=0), _IN_CYCLE_SPIN_SECONDS)
            return None
        counts = [int(n) for n in lengths]
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
        recv = np.empty(sum(counts), dtype=np.uint8)
        self._wait(comm.Igatherv([send, byte], [recv, (counts, displs), byte], root=0), _IN_CYCLE_SPIN_SECONDS)
        return [recv[d : d + n].tobytes() for d, n in zip(displs, counts)]

    def _broadcast_bytes(self, comm: MPI.Comm, payload: bytes | None) -> bytes:
        self._stats["control_calls"] += 1
        length = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
        self._wait(comm.Ibcast(length, root=0), _IN_CYCLE_SPIN_SECONDS)
        if comm.Get_rank() == 0:
            buf = np.frombuffer(payload or b"", dtype=np.uint8).copy()
        else:
            buf = np.empty(int(length[0]), dtype=np.uint8)
        self._wait(comm.Ibcast([buf, self._mpi.BYTE], root=0), _IN_CYCLE_SPIN_SECONDS)
        return buf.tobytes()

    # -- host groups: the gRPC control plane's per-host aggregation ---------------------------------

    def split_host_group(self) -> list[int]:
        """Collective over the job: group the ranks of each host; returns this host's global ranks,
        lowest first (that rank, the host leader, speaks for the others)."""
        world = self._comms[0]
        self._host = world.Split_type(self._mpi.COMM_TYPE_SHARED, key=world.Get_rank())
        ranks = np.empty(self._host.Get_size(), dtype=np.int64)
        self._host.Allgather(np.array([world.Get_rank()], dtype=np.int64), ranks)
        return [int(r) for r in ranks]

    def host_gather_bytes(self, payload: bytes, lengths: Sequence[int]) -> list[bytes] | None:
        """Gather the host's payloads (lengths known to all, in host order) to the host leader."""
        # The gRPC control plane calls split_host_group() before any host exchange.
        return self._gather_bytes(cast("MPI.Comm", self._host), payload, lengths)

    def host_broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Broadcast the host leader's payload to the host's ranks."""
        return self._broadcast_bytes(cast("MPI.Comm", self._host), payload)

    def fail_waits(self, reason: str) -> None:
        """Make any current or future control-plane wait raise `AbortedError(reason)` (the job is
        being aborted and this rank may be waiting for a peer that will never come)."""
        self._failure = reason

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes

    def abandon(self) -> None:
        self._abandoned = True

    # -- data plane --------------------------------------------------------------------------------

    def _chunk_elements(self, buf: np.ndarray) -> int:
        if self.chunk_bytes <= 0:
            return max(buf.size, 1)
        return max(self.chunk_bytes // max(buf.itemsize, 1), 1)

    def allreduce_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                   after_chunk: Callable[[np.ndarray], None] | None = None) -> None:
        if buf.nbytes > self.chunk_bytes or self._local is not None:
            self._allreduce_chunks_(buf, op, process_set_id, after_chunk)
            return
        # One call, the steady state's small tensors: `_data_plane` written out (a call less).
        self._data_set = process_set_id
        self._data_since = time.monotonic()
        try:
            self._comms[process_set_id].Allreduce(self._mpi.IN_PLACE, buf, op=self._ops[op])
        finally:
            self._data_since = 0.0
        self._data_done[process_set_id] = self._data_done.get(process_set_id, 0) + 1
        if after_chunk is not None:
            after_chunk(buf)
        stats = self._stats
        stats["data_calls"] += 1
        stats["data_bytes"] += buf.nbytes

    @_data_plane
    def _allreduce_chunks_(self, buf: np.ndarray, op: ReduceOp, process_set_id: int,
                           after_chunk: Callable[[np.ndarray], None] | None) -> None:
        comm = self._comms[process_set_id]
        mpi_op = self._ops[op]
        step = self._chunk_elements(buf)
        in_place = self._mpi.IN_PLACE
        hierarchical = self._local is not None and process_set_id == 0
        for start in range(0, buf.size, step):
            chunk = buf[start : start + step]
            if hierarchical:
                self._hierarchical_allreduce_(chunk, mpi_op)
            else:
                comm.Allreduce(in_place, chunk, op=mpi_op)
            if after_chunk is not None:
                after_chunk(chunk)
            self._stats["data_calls"] += 1
        self._stats["data_bytes"] += buf.nbytes

    @_data_plane
    def allreduce_pieces_(self, buf: np.ndarray, combine: Callable[[np.ndarray], np.ndarray],
                          process_set_id: int) -> None:
        comm = self._comms[process_set_id]
        members, me = comm.Get_size(), comm.Get_rank()
        step = self._chunk_elements(buf)
        for start in range(0, buf.size, step):
            chunk = buf[start : start + step]
            counts = split_counts(chunk.size, members)
            displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
            mine = counts[me]
            recv = np.empty((members, mine), dtype=buf.dtype)
            comm.Alltoallv([chunk, (counts, displs)],
                           [recv, ([mine] * members, [i * mine for i in range(members)])])
            combined = np.ascontiguousarray(combine(recv), dtype=buf.dtype)
            comm.Allgatherv(combined, [chunk, (counts, displs)])
            self._stats["data_calls"] += 2
        self._stats["data_bytes"] += buf.nbytes

    def _hierarchical_allreduce_(self, chunk: np.ndarray, mpi_op: MPI.Op) -> None:
        local = cast("MPI.Comm", self._local)  # called only once _split_hosts kept a host communicator
        if self._cross is not None:
            local.Reduce(self._mpi.IN_PLACE, chunk, op=mpi_op, root=0)
            self._cross.Allreduce(self._mpi.IN_PLACE, chunk, op=mpi_op)
        else:
            local.Reduce(chunk, None, op=mpi_op, root=0)
        local.Bcast(chunk, root=0)
        self._stats["hierarchical_calls"] += 1

    @_data_plane
    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                   process_set_id: int) -> None:
        comm = self._comms[process_set_id]
        counts = [int(c) for c in counts]
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
        comm.Allgatherv(send, [recv, (counts, displs)])
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += recv.nbytes

    @_data_plane
    def broadcast_(self, buf: np.ndarray, root: int, process_set_id: int) -> None:
        comm = self._comms[process_set_id]
        step = self._chunk_elements(buf)
        for start in range(0, buf.size, step):
            comm.Bcast(buf[start : start + step], root=root)
            self._stats["data_calls"] += 1
        self._stats["data_bytes"] += buf.nbytes

    @_data_plane
    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], process_set_id: int) -> None:
        comm = self._comms[process_set_id]

        def layout(counts: Sequence[int]) -> tuple[list[int], list[int]]:
            ints = [int(c) for c in counts]
            return ints, np.concatenate(([0], np.cumsum(ints)[:-1])).astype(int).tolist()

        comm.Alltoallv([send, layout(send_counts)], [recv, layout(recv_counts)])
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += send.nbytes

    @_data_plane
    def reducescatter(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      op: ReduceOp, process_set_id: int) -> None:
        comm = self._comms[process_set_id]
        comm.Reduce_scatter(send, recv, [int(c) for c in recv_counts], op=self._ops[op])
        self._stats["data_calls"] += 1
        self._stats["data_bytes"] += send.nbytes

    # -- process sets ------------------------------------------------------------------------------

    def add_process_set(self, process_set_id: int, ranks: Sequence[int]) -> None:
        world = self._comms[0]
        member = world.Get_rank() in ranks
        color = 0 if member else self._mpi.UNDEFINED
        comm = world.Split(color, key=world.Get_rank())
        if member:
            self._comms[process_set_id] = comm
            self._set_ranks[process_set_id] = tuple(ranks)

    def remove_process_set(self, process_set_id: int) -> None:
        self._set_ranks.pop(process_set_id, None)
        comm = self._comms.pop(process_set_id, None)
        if comm is not None and process_set_id != 0:
            comm.Free()

    def close(self) -> None:
        if self._liveness is not None:
            self._liveness.close()
        for extra in (self._local, self._cross, self._host):
            if extra is not None:
                try:
                    extra.Free()
                except Exception:  # noqa: BLE001 - freeing during interpreter exit may fail harmlessly
                    pass
        self._local = self._cross = self._host = None
        for set_id in list(self._comms):
            comm = self._comms.pop(set_id)
            try:
                comm.Free()
            except Exception:  # noqa: BLE001 - freeing during interpreter exit may fail harmlessly
                pass
        try:
            self._control.Free()
        except Exception:  # noqa: BLE001
            pass
