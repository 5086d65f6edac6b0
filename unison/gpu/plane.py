"""The GPU data plane: runs one negotiated response on device buffers, with NCCL or staged through host MPI.

The executor hands a response here when its ``device`` is not ``"cpu"`` (every member asked for the
same device kind, which negotiation checks), so all members take the same path. The plan is the
host's: the same responses, fused the same way; only packing, scaling and the wire differ.

On the NCCL path everything runs on unison's one stream of the device (`unison.gpu.ordering` has the
rules): wait on the inputs' events, pack the fused tensors into one persistent device buffer with the
prescale, reduce in place, postscale, unpack, record one event, attach it to the results. A single
tensor is reduced in its own output buffer, unfused. Half precision is summed by NCCL in half precision.
A response NCCL cannot carry (Adasum, int16/uint16 reductions) is staged: copied to host memory, run
by the host executor over the control-plane backend (the executor hands the plane its `run_on_host`),
and copied back. With ``operations="mpi"`` a
response goes to CUDA-aware MPI on the device buffers when every member of its set has a CUDA-aware
MPI library (`unison.gpu.mpi_wire`; the same device-side plan as NCCL's, only the wire differs), and
is staged otherwise.

Communicators are made on first use per (process set, device) (`CommunicatorCache`): the members
exchange their (host, PCI bus id) over the host backend and refuse a shared GPU by name, the set's
lowest rank makes the unique id and broadcasts it over the host backend, and NCCL's set-up is bounded
(`unison.gpu.nccl.connect_bounded`), so a rank that never arrives is named instead of hanging the job.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import numpy as np

from ..backends.base import Backend
from ..errors import HorovodInternalError
from ..ops import CollectiveKind, TextEnum
from ..protocol.messages import Response
from ..protocol.negotiation import reducescatter_rows
from .communicators import CommunicatorCache
from .device import Array, Device, DeviceBuffer, raw
from .mpi_wire import MPI_DATA_PLANES, MpiDeviceComm, mpi_can_carry
from .nccl import (
    DEFAULT_INIT_TIMEOUT_SECONDS,
    Comm,
    InitState,
    Library,
    connect_bounded,
    init_failure,
    nccl_dtype,
    wire_carries,
)
from .ordering import Retention, publish, wait_for_inputs
from .placement import RECORD_BYTES, Placement, decode_placements, encode_placement, placement_error

if TYPE_CHECKING:
    from ..engine.handles import Entry

__all__ = ["GpuPlane", "OPERATIONS", "PlaneState", "create_device_plane", "uses_nccl"]

logger = logging.getLogger(__name__)

OPERATIONS = ("nccl", "mpi")
_ALLREDUCE = CollectiveKind.ALLREDUCE.value

# Runs a response (device "cpu") on host entries and returns one result per name: `Executor.run_on_host`.
HostRunner = Callable[[Response, Sequence["Entry | None"]],
                      list["np.ndarray | tuple[np.ndarray, np.ndarray] | None"]]

# An executor `Entry` on the device path: its input and output hold `DeviceBuffer`s, where `Entry`
# types them as host arrays, so the entry cannot be spelled as `Entry` here.
_DeviceEntry: TypeAlias = Any

_C = TypeVar("_C")  # a communicator kind: NCCL's `Comm`, or `MpiDeviceComm`


def _elements(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def uses_nccl(response: Response, operations: str) -> bool:
    """Whether `response` runs over NCCL (True) or is staged through host memory (False).

    Decided from the response and the job-wide setting only, so every member decides alike.

    Example:
        >>> from unison.dtypes import DType
        >>> uses_nccl(Response("allreduce", ("g",), DType.INT16, device="cuda"), "nccl")
        False
    """
    return operations == "nccl" and wire_carries(response, lambda dtype: nccl_dtype(dtype) is not None)


class PlaneState(TextEnum):
    """A plane's lifecycle: open, then closed for good (its communicators and buffers freed)."""

    OPEN = "open"
    CLOSED = "closed"


class GpuPlane:
    """Runs responses on `DeviceBuffer` entries for one rank and one device.

    Args:
        backend: the host plane (control plane, and the wire of staged responses).
        rank: this process's global rank.
        process_sets: the engine's live mapping of set id -> sorted global ranks.
        device: this rank's GPU (`CupyDevice`, or `FakeDevice` in tests).
        library: NCCL (`CupyLibrary`, `FakeLibrary`); None stages every response.
        operations: ``"nccl"`` or ``"mpi"`` (staged through host memory), as
            ``UNISON_GPU_OPERATIONS``/``HOROVOD_GPU_OPERATIONS`` say.
        init_timeout_seconds: the bound on making one NCCL communicator.
        host: this rank's host name, for the rank -> GPU table.
        cuda_aware_mpi: with ``operations="mpi"``, whether this rank's MPI library says it is
            CUDA-aware; None when the backend cannot take device buffers at all (not MPI), which must
            be the same on every rank (it is: every rank uses the same controller).
        run_on_host: runs a staged response on host copies (the executor's `run_on_host`); None: a
            host executor of the plane's own, made at the first staged response.
    """

    def __init__(self, backend: Backend, rank: int, process_sets: dict[int, tuple[int, ...]], device: Device,
                 library: Library | None, *, operations: str = "nccl",
                 init_timeout_seconds: float = DEFAULT_INIT_TIMEOUT_SECONDS, host: str | None = None,
                 cuda_aware_mpi: bool | None = None, run_on_host: HostRunner | None = None) -> None:
        if operations not in OPERATIONS:
            raise ValueError(f"GPU operations must be one of {list(OPERATIONS)}. Got {operations!r}.")
        self.backend = backend
        self.rank = rank
        self.process_sets = process_sets
        self.device = device
        self.library = library
        self.operations = operations if library is not None else "mpi"
        self.init_timeout_seconds = init_timeout_seconds
        self.host = host if host is not None else socket.gethostname()
        self._stream = device.stream()
        self._fusion: Array | None = None  # one persistent buffer for unison's one stream
        self._comms: CommunicatorCache[Comm] = CommunicatorCache(self._make_comm, lambda comm: comm.close())
        self._cuda_aware_mpi = cuda_aware_mpi
        self._mpi_comms: CommunicatorCache[MpiDeviceComm] = CommunicatorCache(self._make_mpi_comm,
                                                                              lambda comm: comm.close())
        self._made_with: dict[int, tuple[int, ...]] = {}
        self._retention = Retention(device)
        self._run_on_host = run_on_host
        self._state = PlaneState.OPEN
        self._stats = {"responses": 0, "tensors": 0, "fused_responses": 0, "staged_responses": 0,
                       "mpi_direct_responses": 0, "bytes": 0}

    def __repr__(self) -> str:
        return (f"<GpuPlane rank={self.rank} device={self.device.name} operations={self.operations} "
                f"{self._state}>")

    def statistics(self) -> dict[str, int]:
        """Counters: responses, tensors, fused, staged and CUDA-aware-MPI responses, bytes, communicators,
        buffers held."""
        fusion_bytes = 0 if self._fusion is None else int(self._fusion.nbytes)
        comms = self._comms.statistics()
        return dict(self._stats, fusion_buffer_bytes=fusion_bytes, communicators=comms["open"],
                    communicators_made=comms["made"], retained=len(self._retention))

    def close(self) -> None:
        """Release every communicator and the fusion buffer (at shutdown)."""
        self._comms.close()
        self._mpi_comms.close()
        self._made_with.clear()
        self._fusion = None
        self._state = PlaneState.CLOSED

    # -- entry point ----------------------------------------------------------------------------
    def run(self, response: Response, entries: Sequence[_DeviceEntry | None]
            ) -> list[DeviceBuffer | tuple[DeviceBuffer | None, np.ndarray | None] | None]:
        """Execute `response`; `entries[i]` is this rank's `Entry` for ``response.names[i]`` or None.

        Returns one result per name: a `DeviceBuffer` whose event the consumer waits on (alltoall: a
        (`DeviceBuffer`, received counts) pair), or None for a joined rank.
        """
        if self._state is not PlaneState.OPEN:
            raise HorovodInternalError("the GPU data plane is closed; unison is shutting down.")
        self._retention.release()
        self._stats["responses"] += 1
        self._stats["tensors"] += len(response.names)
        self._stats["bytes"] += response.num_bytes()
        buffers = [b for e in entries if e is not None for b in (e.input, e.output)]
        for buffer in buffers:
            if buffer is not None and not isinstance(buffer, DeviceBuffer):
                raise HorovodInternalError(
                    f"{response.kind} of {list(response.names)} was negotiated for device "
                    f"{response.device!r} but this rank submitted a host buffer; pass device= to submit.")
        wait_for_inputs(self.device, self._stream, buffers)
        if uses_nccl(response, self.operations):
            arrays, extra = self._run_on_device(self._comm(response.process_set_id, self._comms), response,
                                                entries)
        elif (mpi := self._direct_mpi(response)) is not None:
            self._stats["mpi_direct_responses"] += 1
            arrays, extra = self._run_on_device(mpi, response, entries)
        else:
            self._stats["staged_responses"] += 1
            arrays, extra = self._run_staged(response, entries)
        event, results = publish(self.device, self._stream, arrays)
        self._retention.hold(event, [b.array for b in buffers if b is not None] + list(arrays))
        if extra is not None:  # alltoall: the received counts travel with the tensor
            return [(results[0], extra)]
        return list(results)

    # -- communicators --------------------------------------------------------------------------
    def _comm(self, process_set_id: int, cache: CommunicatorCache[_C]) -> _C:
        members = self.process_sets[process_set_id]
        for stale in [s for s in self._made_with if self.process_sets.get(s) != self._made_with[s]]:
            self._comms.drop_set(stale)  # the set was removed, or its id reused for other ranks
            self._mpi_comms.drop_set(stale)
            del self._made_with[stale]
        comm = cache.get(process_set_id, self.device.ordinal, members, self.rank)
        self._made_with[process_set_id] = members
        return comm

    def _direct_mpi(self, response: Response) -> MpiDeviceComm | None:
        """The set's CUDA-aware MPI wire for `response`, or None to stage it.

        The conditions before the agreement are the same on every member (the setting, the backend
        kind, the response), so either all members agree on the set's first such response or none does.
        """
        if self.operations != "mpi" or self._cuda_aware_mpi is None or not mpi_can_carry(response):
            return None
        comm: MpiDeviceComm = self._comm(response.process_set_id, self._mpi_comms)
        return comm if comm.usable else None

    def _make_mpi_comm(self, process_set_id: int, ordinal: int, members: Sequence[int],
                       index: int) -> MpiDeviceComm:
        """Agree over the control plane whether every member's MPI is CUDA-aware; collective over the set."""
        size = len(members)
        flags = np.empty(size, dtype=np.uint8)
        self.backend.allgatherv(np.array([1 if self._cuda_aware_mpi else 0], dtype=np.uint8), flags, [1] * size,
                                process_set_id)
        refusing = [rank for rank, flag in zip(members, flags) if not flag]
        if refusing and index == 0:
            logger.info("GPU responses of process set %d are staged through host memory: the MPI library of "
                        "ranks %s is not CUDA-aware (or cannot say)", process_set_id, refusing)
        return MpiDeviceComm(self.backend, process_set_id, self.device, size, index, not refusing, refusing)

    # -- NCCL -----------------------------------------------------------------------------------

    def _make_comm(self, process_set_id: int, ordinal: int, members: Sequence[int], index: int) -> Comm:
        """Check placement, share the unique id and connect within the bound; collective over the set."""
        size = len(members)
        mine = encode_placement(Placement(self.host, ordinal, self.device.bus_id()))
        gathered = np.empty(RECORD_BYTES * size, dtype=np.uint8)
        self.backend.allgatherv(np.frombuffer(mine, dtype=np.uint8).copy(), gathered, [RECORD_BYTES] * size,
                                process_set_id)
        clash = placement_error(decode_placements(gathered.tobytes()), members)
        if clash:
            raise HorovodInternalError(clash + " (UNISON_GPU_OPERATIONS=MPI stages through host memory "
                                       "instead, for testing several ranks on one GPU.)")
        assert self.library is not None
        library = self.library
        unique_id = np.zeros(128, dtype=np.uint8)
        if self.rank == CommunicatorCache.id_maker(members):
            unique_id[:] = np.frombuffer(library.unique_id(), dtype=np.uint8)
        self.backend.broadcast_(unique_id, 0, process_set_id)  # set rank 0 is the lowest global rank
        state, comm, error = connect_bounded(
            lambda: library.connect(unique_id.tobytes(), size, index, self.device), self.init_timeout_seconds)
        states = np.empty(size, dtype=np.uint8)
        self.backend.allgatherv(np.array([int(state)], dtype=np.uint8), states, [1] * size, process_set_id)
        failure = init_failure([InitState(int(s)) for s in states], members, process_set_id,
                               self.init_timeout_seconds)
        if failure:
            if comm is not None:
                comm.close()
            raise HorovodInternalError(failure + (f" On rank {self.rank}: {error}" if error else ""))
        assert comm is not None
        return comm

    def _fusion_view(self, count: int, dtype: np.dtype) -> Array:
        nbytes = count * dtype.itemsize
        if self._fusion is None or self._fusion.nbytes < nbytes:
            self._fusion = self.device.allocate(nbytes)
        return self._fusion[:nbytes].view(dtype)

    def _set_rank(self, response: Response) -> tuple[int, int]:
        members = self.process_sets[response.process_set_id]
        return members.index(self.rank), len(members)

    def _run_on_device(self, comm: Comm, response: Response, entries: Sequence[_DeviceEntry]
                       ) -> tuple[list[Array | None], np.ndarray | None]:
        """Run `response` on device buffers over `comm` (NCCL, or CUDA-aware MPI)."""
        kind = CollectiveKind(response.kind)
        if kind is CollectiveKind.ALLREDUCE:
            return self._allreduce(comm, response, entries), None
        entry = entries[0]
        array = entry.input.array
        stream, device = self._stream, self.device
        me, set_size = self._set_rank(response)
        if kind is CollectiveKind.BROADCAST:
            out = entry.output.array
            if self.rank == response.root_rank and entry.output is not entry.input:
                device.copy_(out, array, stream)
            comm.broadcast_(raw(out), self.process_sets[response.process_set_id].index(response.root_rank),
                            stream)
            return [out], None
        rest = tuple(array.shape[1:])
        row = _elements(rest)
        if kind is CollectiveKind.ALLGATHER:
            counts = [d * row for d in response.sizes[0]]
            out = device.empty((sum(response.sizes[0]), *rest), array.dtype, stream)
            if len(set(counts)) == 1:
                comm.allgather(raw(array), raw(out), stream)
            else:
                comm.allgatherv(raw(array), raw(out), counts, stream)
            return [out], None
        if kind is CollectiveKind.ALLTOALL:
            matrix = response.sizes[0]
            received = [matrix[sender][me] for sender in range(set_size)]
            out = device.empty((sum(received), *rest), array.dtype, stream)
            comm.alltoallv(raw(array), [c * row for c in matrix[me]], raw(out), [c * row for c in received],
                           stream)
            return [out], np.array(received, dtype=np.int32)
        if kind is CollectiveKind.REDUCESCATTER:
            return [self._reducescatter(comm, response, array, me, set_size)], None
        raise ValueError(f"the GPU data plane cannot run {response.kind!r}")

    def _allreduce(self, comm: Comm, response: Response, entries: Sequence[_DeviceEntry | None]) -> list[Array | None]:
        dtype, stream, device = response.dtype, self._stream, self.device
        _, set_size = self._set_rank(response)
        pre, post = response.prescale, response.post_factor(set_size)
        single = entries[0] if len(entries) == 1 else None
        if single is not None:
            # One tensor: reduced in its own output buffer, no fusion copy.
            out = single.output.array.reshape(-1)
            if single.output is not single.input:
                device.copy_scaled_(out, single.input.array.reshape(-1), pre, dtype, stream)
            else:
                device.scale_(out, pre, dtype, stream)
            comm.allreduce_(out, dtype, response.reduce_op, stream)
            device.scale_(out, post, dtype, stream)
            return [single.output.array]
        self._stats["fused_responses"] += 1
        counts = [_elements(shape) for shape in response.shapes]
        buf = self._fusion_view(sum(counts), dtype.storage)
        device.pack(buf, [None if e is None else e.input.array for e in entries], counts, pre, dtype, stream)
        comm.allreduce_(buf, dtype, response.reduce_op, stream)
        device.scale_(buf, post, dtype, stream)
        outputs = [None if e is None else e.output.array for e in entries]
        device.unpack(buf, outputs, counts, stream)
        return outputs

    def _reducescatter(self, comm: Comm, response: Response, array: Array, me: int, set_size: int) -> Array:
        dtype, stream, device = response.dtype, self._stream, self.device
        shape = tuple(array.shape)
        rows = reducescatter_rows(shape[0], set_size)
        row = _elements(shape[1:])
        counts = [r * row for r in rows]
        pre, post = response.prescale, response.post_factor(set_size)
        out = device.empty((rows[me], *shape[1:]), dtype.storage, stream)
        send = array.reshape(-1)
        if pre != 1.0 or len(set(counts)) != 1:
            scratch = device.empty((send.size,), dtype.storage, stream)
            device.copy_scaled_(scratch, send, pre, dtype, stream)
            send = scratch
        if len(set(counts)) == 1:
            comm.reducescatter(send, out.reshape(-1), dtype, response.reduce_op, stream)
        else:
            # NCCL's reduce-scatter needs equal pieces: reduce everything, keep this member's rows.
            comm.allreduce_(send, dtype, response.reduce_op, stream)
            start = sum(counts[:me])
            device.copy_(out.reshape(-1), send[start : start + counts[me]], stream)
        device.scale_(out, post, dtype, stream)
        return out

    # -- staged through host memory -------------------------------------------------------------
    def _run_staged(self, response: Response, entries: Sequence[_DeviceEntry | None]) -> tuple[list[Array | None], np.ndarray | None]:
        """Copy to host, run the host executor over the backend, copy results back to the device."""
        from ..engine.handles import Entry, Handle

        if self._run_on_host is None:  # a plane made outside an executor (tests): one of its own
            from ..engine.executor import Executor

            self._run_on_host = Executor(self.backend, self.rank, self.process_sets).run
        stream, device = self._stream, self.device
        host_entries: list[Entry | None] = []
        for entry in entries:
            if entry is None:
                host_entries.append(None)
                continue
            source = entry.input.array
            host_in = device.to_host(source, stream).reshape(source.shape)
            if entry.output is None:
                host_out = None
            elif entry.output is entry.input:
                host_out = host_in
            else:
                host_out = np.empty_like(host_in)
            host_entries.append(Entry(entry.request, host_in, host_out, Handle(entry.request.name)))
        # the host copy of the response: same plan, host buffers (else the executor would route it back here)
        results = self._run_on_host(dataclasses.replace(response, device="cpu"), host_entries)
        arrays: list[Array | None] = []
        extra = None
        for entry, result in zip(entries, results):
            if entry is None or result is None:
                arrays.append(None)
                continue
            if isinstance(result, tuple):  # alltoall: (tensor, received counts)
                result, extra = result
            if entry.output is not None:
                target = entry.output.array
            else:
                target = device.empty(result.shape, result.dtype, stream)
            device.from_host(target, result, stream)
            arrays.append(target)
        return arrays, extra


def create_device_plane(backend: Backend, rank: int, process_sets: dict[int, tuple[int, ...]], *,
                        operations: str = "nccl",
                        init_timeout_seconds: float = DEFAULT_INIT_TIMEOUT_SECONDS,
                        use_cuda_aware_mpi: bool = True, run_on_host: HostRunner | None = None) -> GpuPlane:
    """The plane on this process's GPU through CuPy (the executor calls it at the first device response).

    The GPU is the one the adapters bound at submission (`unison.gpu.handoff.device_for`); a rank that
    joined before submitting any GPU tensor uses CuPy's current device. With ``operations="mpi"``
    over the MPI backend, the MPI library is asked whether it is CUDA-aware (`use_cuda_aware_mpi`
    False answers no without asking).
    """
    from . import handoff

    ordinal = handoff.bound_ordinal()
    if ordinal is None:
        ordinal = int(handoff.import_cupy().cuda.runtime.getDevice())
    device = handoff.device_for(ordinal)
    library = None
    if operations == "nccl":
        from .cupy_device import CupyLibrary

        library = CupyLibrary()
    cuda_aware = None  # only an MPI data plane can take device buffers, and every rank has the same backend
    if operations == "mpi" and backend.name in MPI_DATA_PLANES:
        from ..backends.mpi import import_mpi
        from .build import cuda_aware_mpi

        cuda_aware = bool(use_cuda_aware_mpi and cuda_aware_mpi(import_mpi()))
    return GpuPlane(backend, rank, process_sets, device, library, operations=operations,
                    init_timeout_seconds=init_timeout_seconds, cuda_aware_mpi=cuda_aware,
                    run_on_host=run_on_host)
