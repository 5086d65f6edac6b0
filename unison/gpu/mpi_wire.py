"""CUDA-aware MPI as a wire of the GPU data plane: device buffers handed to MPI directly, no host copy.

With ``UNISON_GPU_OPERATIONS=MPI`` a response is staged through host memory unless every member of its
process set runs an MPI library that says it is CUDA-aware (`unison.gpu.build.cuda_aware_mpi`: MPI's
own answer, never assumed). The members agree once per set, over the control plane, when the set's
first response that MPI can carry runs; after that every member takes the same path for the same
response. On this wire the plane is the NCCL path's (fusion into the persistent device buffer,
scaling on the device), and each collective is the MPI backend's own call on device memory: the data
plane's chunking and hierarchical allreduce apply as they do to host buffers.

MPI knows nothing of CUDA streams: before each call the host waits for unison's stream, so the packing
and prescaling kernels have finished when MPI reads; MPI's blocking calls are done with the memory
when they return, so the postscale queued after them reads the result.

Half precision, bool and Adasum reductions stay staged: the host executor reduces those with its own
arithmetic on host memory (float32 sums rounded once), which MPI cannot do on device memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends.base import Backend
from ..dtypes import DType
from ..ops import ReduceOp
from ..protocol.messages import Response
from .device import Array, Device, Stream
from .nccl import wire_carries

__all__ = ["DIRECT_REDUCTIONS", "MPI_DATA_PLANES", "MpiDeviceComm", "mpi_can_carry"]

# Backends whose data plane is MPI (the gRPC controller's moves its data over MPI too).
MPI_DATA_PLANES = ("mpi", "grpc+mpi")

# Reductions MPI runs natively on these types (MPI_SUM etc.); the others need the host's arithmetic.
DIRECT_REDUCTIONS = frozenset({DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.INT64,
                               DType.FLOAT32, DType.FLOAT64})


def mpi_can_carry(response: Response) -> bool:
    """Whether CUDA-aware MPI can run `response` on device buffers (decided from the response only).

    Example:
        >>> mpi_can_carry(Response("allreduce", ("g",), DType.FLOAT16, device="cuda"))
        False
    """
    return wire_carries(response, DIRECT_REDUCTIONS.__contains__)


class MpiDeviceComm:
    """The plane's `Comm` over a CUDA-aware MPI backend, for one process set.

    Args:
        backend: the job's MPI backend (its data-plane calls take device arrays as they take NumPy ones).
        process_set_id: the set this communicator serves.
        device: this rank's device, whose stream the host waits for before each call.
        size: the set's size.
        index: this rank's position in the set.
        usable: whether every member said its MPI is CUDA-aware (else the plane stages the set's responses).
        refusing: the global ranks whose MPI said no or could not tell, for the log.
    """

    def __init__(self, backend: Backend, process_set_id: int, device: Device, size: int, index: int,
                 usable: bool, refusing: Sequence[int] = ()) -> None:
        self._backend = backend
        self._set = process_set_id
        self._device = device
        self.size = size
        self.index = index
        self.usable = usable
        self.refusing = tuple(refusing)

    def __repr__(self) -> str:
        state = "direct" if self.usable else f"staged (ranks {list(self.refusing)} not CUDA-aware)"
        return f"<MpiDeviceComm set={self._set} {self.index}/{self.size} {state}>"

    def _ready(self, stream: Stream) -> None:
        self._device.synchronize_stream(stream)  # MPI reads device memory outside any stream

    @staticmethod
    def _op(op: ReduceOp) -> ReduceOp:
        return ReduceOp.SUM if op is ReduceOp.AVERAGE else op  # the plane divides afterwards

    def allreduce_(self, buf: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        self._ready(stream)
        self._backend.allreduce_(buf, self._op(op), self._set)

    def allgather(self, send: Array, recv: Array, stream: Stream) -> None:
        self.allgatherv(send, recv, [int(send.size)] * self.size, stream)

    def allgatherv(self, send: Array, recv: Array, counts: Sequence[int], stream: Stream) -> None:
        self._ready(stream)
        self._backend.allgatherv(send, recv, counts, self._set)

    def broadcast_(self, buf: Array, root: int, stream: Stream) -> None:
        self._ready(stream)
        self._backend.broadcast_(buf, root, self._set)

    def alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array, recv_counts: Sequence[int],
                  stream: Stream) -> None:
        self._ready(stream)
        self._backend.alltoallv(send, send_counts, recv, recv_counts, self._set)

    def reducescatter(self, send: Array, recv: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        self._ready(stream)
        self._backend.reducescatter(send, recv, [int(recv.size)] * self.size, self._op(op), self._set)

    def close(self) -> None:
        """Nothing to release: the backend owns the MPI communicators."""
