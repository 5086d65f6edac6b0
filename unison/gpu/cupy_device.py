"""The CUDA device and NCCL of the GPU data plane, through CuPy; imported only once a CUDA buffer arrives.

`CupyDevice` gives `ArrayDevice`'s arithmetic CuPy as its array module and issues every operation on
one non-blocking stream per device (unison's stream) inside that device's context; byte moves are
``cudaMemcpyAsync`` calls on that stream, except fusion's many at once (unscaled packing, unpacking):
those are one launch of `unison.gpu.batched_copy`'s kernel per 128 tensors. `CupyLibrary` and
`CupyComm` wrap ``cupy.cuda.nccl``: pointers and element counts go to NCCL, uneven gathers are
grouped broadcasts, alltoall is grouped send/recv (NCCL has no alltoallv).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import ModuleType
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ops import ReduceOp
from . import batched_copy
from .device import Array, ArrayDevice, Device, Event, Stream
from .lazy_cupy import import_cupy
from .nccl import nccl_dtype, nccl_op

__all__ = ["CupyComm", "CupyDevice", "CupyLibrary", "comm_id", "external_stream", "id_bytes"]

logger = logging.getLogger(__name__)

_PER_THREAD = 2  # cudaStreamPerThread: the handle names a different stream in each thread
_thread = threading.local()


class _StreamHandle:
    """A raw ``cudaStream_t`` behind the CUDA stream protocol (``__cuda_stream__``: version 0, handle)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def external_stream(cupy: ModuleType, handle: int, ordinal: int) -> Stream:
    """A CuPy stream object for a stream another library made (torch's current stream).

    CuPy 14 deprecates ``ExternalStream`` (a DeprecationWarning at every call) for
    ``Stream.from_external``, which takes an object with ``__cuda_stream__``; earlier CuPy has only
    ``ExternalStream``. The device is the one the caller works in (``with`` its `CupyDevice`).
    """
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle, ordinal)


def id_bytes(raw: bytes | bytearray | Sequence[int]) -> bytes:
    """NCCL's unique id from ``nccl.get_unique_id()`` as bytes (CuPy 14 returns bytes, earlier
    CuPy a tuple of signed chars).

    Example:
        >>> id_bytes((1, -1)), id_bytes(b"\\x01\\xff")
        (b'\\x01\\xff', b'\\x01\\xff')
    """
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw)
    return bytes(b % 256 for b in raw)


def comm_id(unique_id: bytes, cupy_version: str) -> bytes | tuple[int, ...]:
    """The id as this CuPy's ``NcclCommunicator`` takes it: bytes from CuPy 14 (which refuses a
    tuple), a tuple of signed chars before.

    Example:
        >>> comm_id(b"\\x01\\xff", "13.6.0"), comm_id(b"\\x01\\xff", "14.2.0")
        ((1, -1), b'\\x01\\xff')
    """
    if int(cupy_version.split(".")[0]) >= 14:
        return bytes(unique_id)
    return tuple(b - 256 if b > 127 else b for b in unique_id)


class CupyDevice(ArrayDevice):
    """One CUDA device through CuPy; `stream()` is unison's stream on it, made on first use.

    `batched_copies` (default True) moves fusion's copies with the batched kernel, compiled on first
    use; where it cannot be compiled (no NVRTC, say) a warning names the cause once and every copy is a
    ``cudaMemcpyAsync`` of its own, which is correct but slower.
    """

    batched_copies = True

    def __init__(self, ordinal: int) -> None:
        cupy = import_cupy("the GPU data plane")
        self.xp = cupy
        self.ordinal = ordinal
        self.name = f"cuda:{ordinal}"
        self._device = cupy.cuda.Device(ordinal)
        self._stream: Stream | None = None
        self._pinned: np.ndarray | None = None  # one growing pinned staging buffer
        self._copy_kernel: Any = None  # the batched-copy cupy.RawKernel once compiled; False where it cannot be
        self._torch_streams: dict[int, Stream] = {}  # torch stream handle -> its CuPy wrapper

    def __repr__(self) -> str:
        return f"<CupyDevice {self.name}>"

    @contextmanager
    def _on(self, stream: Stream) -> Iterator[None]:
        with self._device:
            if stream is None:
                yield
            else:
                with stream:
                    yield

    def stream(self) -> Stream:
        if self._stream is None:
            with self._device:
                self._stream = self.xp.cuda.Stream(non_blocking=True)
        return self._stream

    def stream_key(self, stream: Stream) -> int | tuple[int, object]:
        """The stream's handle; cudaStreamPerThread (2) is one stream per thread, so the key also holds
        a token of the calling thread (an object, unlike a thread id never reused by a later thread)."""
        ptr = int(stream.ptr)
        if ptr != _PER_THREAD:
            return ptr
        token = getattr(_thread, "token", None)
        if token is None:
            token = _thread.token = object()
        return (ptr, token)

    def current_stream(self, framework: str = "cupy") -> Stream:
        """torch's current stream on this device for torch tensors, else CuPy's (CuPy arrays, TensorFlow's
        handoff): the caller names the framework whose kernels made or will read the array."""
        if framework == "torch":
            import torch

            handle = torch.cuda.current_stream(self.ordinal).cuda_stream
            # one wrapper per handle: a handle names one stream while it exists, and a later stream
            # given the same handle is the same stream to CUDA
            stream = self._torch_streams.get(handle)
            if stream is None:
                with self._device:
                    stream = self._torch_streams[handle] = external_stream(self.xp, handle, self.ordinal)
            return stream
        with self._device:
            return self.xp.cuda.get_current_stream()

    def record_event(self, stream: Stream) -> Event:
        with self._device:
            event = self.xp.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
        return event

    def wait_event(self, stream: Stream, event: Event) -> None:
        with self._device:
            stream.wait_event(event)

    def event_done(self, event: Event) -> bool:
        return bool(event.done)

    def synchronize_stream(self, stream: Stream) -> None:
        stream.synchronize()

    def allocate(self, nbytes: int) -> Array:
        with self._on(self.stream()):
            return self.xp.empty(nbytes, dtype=self.xp.uint8)

    # -- byte moves: a single copy is one cudaMemcpyAsync (a runtime call, a few microseconds); fusion's
    # copies go to the batched kernel, one launch for up to 128 tensors instead of one call each.
    def _memcpy(self, dst_ptr: int, src_ptr: int, nbytes: int, stream: Stream) -> None:
        if nbytes:
            runtime = self.xp.cuda.runtime
            runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, runtime.memcpyDeviceToDevice, stream.ptr)

    def _batched_kernel(self) -> Any:
        """The compiled batched-copy kernel for this device, or None where it cannot be built."""
        if self._copy_kernel is None:
            try:
                kernel = self.xp.RawKernel(batched_copy.SOURCE, batched_copy.KERNEL_NAME)
                compile_now = getattr(kernel, "compile", None)
                if compile_now is not None:  # compile here, not in the middle of a response
                    compile_now()
                self._copy_kernel = kernel
            except Exception as exc:  # noqa: BLE001 - any build failure leaves the per-copy path, named once
                logger.warning("unison's batched copy kernel could not be built on %s (%s: %s); fusion "
                               "copies each tensor with its own cudaMemcpyAsync instead", self.name,
                               type(exc).__name__, exc)
                self._copy_kernel = False
        return self._copy_kernel or None

    def _copy_many(self, dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray, stream: Stream) -> None:
        """Issue the copies ``dst[i] <- src[i]`` (uint64 addresses and sizes) on `stream`, inside the
        device's context."""
        kernel = self._batched_kernel() if self.batched_copies and len(nbytes) > 1 else None
        if kernel is not None:
            try:
                with stream:
                    for record, blocks in batched_copy.plan_batches(dst, src, nbytes):
                        kernel((blocks,), (batched_copy.THREADS,), (record,))
                return
            except Exception as exc:  # noqa: BLE001 - a launch this driver refuses: per copy, named once
                logger.warning("unison's batched copy kernel could not be launched on %s (%s: %s); fusion "
                               "copies each tensor with its own cudaMemcpyAsync instead", self.name,
                               type(exc).__name__, exc)
                self._copy_kernel = False
        # copies are idempotent: redoing any the kernel already made is harmless
        for d, s, n in zip(dst.tolist(), src.tolist(), nbytes.tolist()):
            self._memcpy(d, s, n, stream)

    def copy_(self, dst: Array, src: Array, stream: Stream) -> None:
        with self._device:
            self._memcpy(dst.data.ptr, src.data.ptr, src.nbytes, stream)

    @staticmethod
    def _pieces(buf: Array, counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The address and byte size of each consecutive piece of `counts[i]` elements of `buf`."""
        sizes = np.asarray(counts, dtype=np.uint64) * np.uint64(buf.itemsize)
        return np.uint64(buf.data.ptr) + np.cumsum(sizes) - sizes, sizes

    @staticmethod
    def _addresses(arrays: Sequence[Array]) -> np.ndarray:
        return np.fromiter((a.data.ptr for a in arrays), dtype=np.uint64, count=len(arrays))

    def pack(self, buf: Array, parts: Sequence[Array | None], counts: Sequence[int], factor: float,
             dtype: DType, stream: Stream) -> None:
        if factor != 1.0:  # scaled on the way in: the arithmetic's kernels
            super().pack(buf, parts, counts, factor, dtype, stream)
            return
        pieces, sizes = self._pieces(buf, counts)
        with self._device:
            if any(part is None for part in parts):  # a joined rank contributes zeros
                present = np.fromiter((part is not None for part in parts), dtype=bool, count=len(parts))
                for index in np.flatnonzero(~present & (sizes > 0)).tolist():
                    self.xp.cuda.runtime.memsetAsync(int(pieces[index]), 0, int(sizes[index]), stream.ptr)
                pieces, sizes = pieces[present], sizes[present]
                parts = [part for part in parts if part is not None]
            self._copy_many(pieces, self._addresses(parts), sizes, stream)

    def unpack(self, buf: Array, outputs: Sequence[Array | None], counts: Sequence[int], stream: Stream) -> None:
        pieces, sizes = self._pieces(buf, counts)
        if any(out is None for out in outputs):
            present = np.fromiter((out is not None for out in outputs), dtype=bool, count=len(outputs))
            pieces, sizes = pieces[present], sizes[present]
            outputs = [out for out in outputs if out is not None]
        with self._device:
            self._copy_many(self._addresses(outputs), pieces, sizes, stream)

    def to_host(self, buf: Array, stream: Stream) -> np.ndarray:
        import cupyx  # part of CuPy

        flat = buf.reshape(-1)
        host = cupyx.empty_pinned(flat.shape, dtype=flat.dtype)
        with self._on(stream):
            flat.get(stream=stream, out=host)
        stream.synchronize()  # the host reads these bytes next: the one wait staging needs
        return np.array(host, copy=True)  # the pinned block is released when `host` goes

    def from_host(self, dst: Array, host: np.ndarray, stream: Stream) -> None:
        with self._on(stream):
            dst.reshape(-1).view(self.xp.uint8).set(np.ascontiguousarray(host).reshape(-1).view(np.uint8),
                                                     stream=stream)
        stream.synchronize()  # `host` may be freed by the caller as soon as this returns

    def bus_id(self) -> str:
        return str(self._device.pci_bus_id)


class CupyComm:
    """An ``NcclCommunicator`` behind the plane's `Comm` protocol."""

    def __init__(self, comm: Any, nccl: ModuleType, size: int, index: int) -> None:  # comm: CuPy's NcclCommunicator
        self._comm = comm
        self._nccl = nccl
        self.size = size
        self.index = index

    def __repr__(self) -> str:
        return f"<CupyComm {self.index}/{self.size}>"

    @staticmethod
    def _ptr(array: Array) -> int:
        return int(array.data.ptr)

    def allreduce_(self, buf: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        code = nccl_dtype(dtype)
        if code is None:
            raise ValueError(f"NCCL cannot reduce {dtype.value}")
        ptr = self._ptr(buf)
        self._comm.allReduce(ptr, ptr, buf.size, code, nccl_op(op), stream.ptr)

    def allgather(self, send: Array, recv: Array, stream: Stream) -> None:
        self._comm.allGather(self._ptr(send), self._ptr(recv), send.nbytes, 1, stream.ptr)

    def allgatherv(self, send: Array, recv: Array, counts: Sequence[int], stream: Stream) -> None:
        itemsize = recv.itemsize
        base = self._ptr(recv)
        self._nccl.groupStart()
        try:
            offset = 0
            for root, count in enumerate(counts):
                if count:
                    source = self._ptr(send) if root == self.index else base + offset
                    self._comm.broadcast(source, base + offset, count * itemsize, 1, root, stream.ptr)
                offset += count * itemsize
        finally:
            self._nccl.groupEnd()

    def broadcast_(self, buf: Array, root: int, stream: Stream) -> None:
        ptr = self._ptr(buf)
        self._comm.broadcast(ptr, ptr, buf.nbytes, 1, root, stream.ptr)

    def alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array, recv_counts: Sequence[int],
                  stream: Stream) -> None:
        itemsize = send.itemsize
        self._nccl.groupStart()
        try:
            send_offset = recv_offset = 0
            for peer in range(self.size):
                if send_counts[peer]:
                    self._comm.send(self._ptr(send) + send_offset, send_counts[peer] * itemsize, 1, peer,
                                    stream.ptr)
                if recv_counts[peer]:
                    self._comm.recv(self._ptr(recv) + recv_offset, recv_counts[peer] * itemsize, 1, peer,
                                    stream.ptr)
                send_offset += send_counts[peer] * itemsize
                recv_offset += recv_counts[peer] * itemsize
        finally:
            self._nccl.groupEnd()

    def reducescatter(self, send: Array, recv: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        code = nccl_dtype(dtype)
        if code is None:
            raise ValueError(f"NCCL cannot reduce {dtype.value}")
        self._comm.reduceScatter(self._ptr(send), self._ptr(recv), recv.size, code, nccl_op(op), stream.ptr)

    def close(self) -> None:
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None


class CupyLibrary:
    """NCCL as CuPy ships it (``cupy.cuda.nccl``)."""

    def __init__(self) -> None:
        cupy = import_cupy("NCCL collectives on GPU tensors")
        from cupy.cuda import nccl

        if not getattr(nccl, "available", True):
            from ..errors import MissingDependencyError

            raise MissingDependencyError(
                f"CuPy {cupy.__version__} is installed without NCCL, which the GPU data plane needs. "
                "Install a CuPy wheel for your CUDA version (pip install cupy-cuda12x or cupy-cuda13x: "
                "the gpu-cuda12 / gpu-cuda13 extras), or set UNISON_GPU_OPERATIONS=MPI to stage through host memory."
            )
        self._nccl = nccl
        self._cupy_version = str(cupy.__version__)

    def unique_id(self) -> bytes:
        return id_bytes(self._nccl.get_unique_id())

    def connect(self, unique_id: bytes, size: int, index: int, device: Device) -> CupyComm:
        with self._device_context(device):
            comm = self._nccl.NcclCommunicator(size, comm_id(unique_id, self._cupy_version), index)
        return CupyComm(comm, self._nccl, size, index)

    @staticmethod
    def _device_context(device: Device) -> AbstractContextManager[object]:
        import cupy

        return cupy.cuda.Device(getattr(device, "ordinal", 0))

    def version(self) -> int:
        return int(self._nccl.get_version())
