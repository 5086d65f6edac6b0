"""The NCCL wire of the GPU data plane: what a communicator does, and how one is made within a time bound.

`Comm` is what the plane calls on device arrays (NCCL through CuPy in `unison.gpu.cupy_device`,
CUDA-aware MPI in `unison.gpu.mpi_wire`, an in-memory world of threads in `unison.gpu.fake`);
`Library` makes unique ids and communicators; `wire_carries` is the rule, shared by both wires, of
which responses a device wire can run.

Making a communicator is collective and NCCL's `ncclCommInitRank` waits, without a bound, for every
member. `connect_bounded` runs it on a helper thread and waits at most `timeout_seconds`; each member
then tells the others over the host control plane how far it got (`InitState`), so every member
reaches the same verdict and `init_failure` names the ranks that never started NCCL's set-up, or
says that all started it and NCCL itself could not connect them.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..dtypes import DType
from ..ops import CollectiveKind, ReduceOp
from ..protocol.messages import Response
from .device import Array, Device, Stream

__all__ = [
    "DEFAULT_INIT_TIMEOUT_SECONDS", "Comm", "InitState", "Library", "connect_bounded", "init_failure",
    "nccl_dtype", "nccl_op", "wire_carries",
]

DEFAULT_INIT_TIMEOUT_SECONDS = 120.0

# ncclDataType_t and ncclRedOp_t, as nccl.h numbers them (stable since NCCL 2.0; bfloat16 since 2.10).
_DTYPES = {DType.INT8: 0, DType.UINT8: 1, DType.INT32: 2, DType.INT64: 4, DType.FLOAT16: 6,
           DType.FLOAT32: 7, DType.FLOAT64: 8, DType.BFLOAT16: 9}
_REDUCING = (CollectiveKind.ALLREDUCE.value, CollectiveKind.REDUCESCATTER.value)
_OPS = {ReduceOp.SUM: 0, ReduceOp.AVERAGE: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}


def nccl_dtype(dtype: DType) -> int | None:
    """NCCL's datatype code for `dtype`, or None where NCCL has none (int16, uint16, bool).

    Example:
        >>> nccl_dtype(DType.BFLOAT16), nccl_dtype(DType.INT16)
        (9, None)
    """
    return _DTYPES.get(dtype)


def wire_carries(response: Response, reduces: Callable[[DType], bool]) -> bool:
    """Whether a device wire (NCCL, CUDA-aware MPI) can run `response`: anything that only moves
    bytes; a reduction that is not Adasum, of a dtype the wire `reduces`. Decided from the response
    alone, so every member decides alike.

    Example:
        >>> wire_carries(Response("allreduce", ("g",), DType.INT16, device="cuda"), lambda d: nccl_dtype(d) is not None)
        False
    """
    if response.kind in _REDUCING:
        return response.reduce_op is not ReduceOp.ADASUM and reduces(response.dtype)
    return True


def nccl_op(op: ReduceOp) -> int:
    """NCCL's reduction code (Average is a Sum; the plane scales afterwards, as the host executor does).

    Raises:
        ValueError: `op` has no NCCL reduction (Adasum).
    """
    code = _OPS.get(op)
    if code is None:
        raise ValueError(f"NCCL has no reduction for {op.name}; only Sum, Average, Min, Max and Product.")
    return code


class Comm(Protocol):
    """One NCCL communicator: collectives on flat device arrays, issued on a stream."""

    def allreduce_(self, buf: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        """Reduce `buf` in place across members (Average arrives here as Sum)."""

    def allgather(self, send: Array, recv: Array, stream: Stream) -> None:
        """Equal pieces: recv holds every member's `send`, in member order (raw arrays)."""

    def allgatherv(self, send: Array, recv: Array, counts: Sequence[int], stream: Stream) -> None:
        """Uneven pieces: counts[i] elements from member i (raw arrays)."""

    def broadcast_(self, buf: Array, root: int, stream: Stream) -> None:
        """Overwrite `buf` with member `root`'s (raw array)."""

    def alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array, recv_counts: Sequence[int],
                  stream: Stream) -> None:
        """Send send_counts[i] elements to member i, receive recv_counts[i] from it (raw arrays)."""

    def reducescatter(self, send: Array, recv: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        """Reduce `send` (members x recv.size elements) and keep this member's equal piece in `recv`."""

    def close(self) -> None:
        """Release the communicator."""


class Library(Protocol):
    """NCCL itself: unique ids, communicators, the version."""

    def unique_id(self) -> bytes:
        """A new unique id (made by one member, sent to the others)."""

    def connect(self, unique_id: bytes, size: int, index: int, device: Device) -> Comm:
        """Join the communicator of `size` members as member `index` on `device`; blocks until all joined."""

    def version(self) -> int:
        """NCCL's version code (e.g. 22005 for 2.20.5)."""


class InitState(enum.IntEnum):
    """How far one member got in making a communicator, as sent to the others."""

    NOT_STARTED = 0  # never reached ncclCommInitRank within the bound
    WAITING = 1  # inside ncclCommInitRank when the bound ran out
    DONE = 2
    FAILED = 3  # ncclCommInitRank raised


def connect_bounded(connect: Callable[[], Comm], timeout_seconds: float,
                    prepare: Callable[[], None] | None = None) -> tuple[InitState, Comm | None, str]:
    """Run ``prepare(); connect()`` on a helper thread and wait at most `timeout_seconds`.

    Returns (how far it got, the communicator or None, the error text or ''). A communicator that
    arrives after the bound is closed by the helper thread, so a verdict given is never contradicted.

    Example:
        >>> connect_bounded(lambda: "comm", 1.0)[:2]
        (<InitState.DONE: 2>, 'comm')
    """
    lock = threading.Lock()
    # state, error, late, communicator: one slot of each type, read back as that type (Any)
    progress: list[Any] = [InitState.NOT_STARTED, "", False, None]

    def work() -> None:
        try:
            if prepare is not None:
                prepare()
            with lock:
                progress[0] = InitState.WAITING
            comm = connect()
        except Exception as exc:  # noqa: BLE001 - becomes the FAILED state every member hears of
            with lock:
                progress[0], progress[1] = InitState.FAILED, f"{type(exc).__name__}: {exc}"
            return
        with lock:
            if progress[2]:
                comm.close()
                return
            progress[0], progress[3] = InitState.DONE, comm

    helper = threading.Thread(target=work, name="unison-nccl-init", daemon=True)
    helper.start()
    helper.join(timeout_seconds)
    with lock:
        progress[2] = True
        state: InitState = progress[0]
        return state, (progress[3] if state is InitState.DONE else None), str(progress[1])


def init_failure(states: Sequence[InitState], ranks: Sequence[int], process_set_id: int,
                 timeout_seconds: float) -> str:
    """The error every member raises when a communicator was not made by all ('' when it was).

    Args:
        states: each member's `InitState`, in set-rank order (identical on every member).
        ranks: the members' global ranks, in the same order.

    Example:
        >>> S = InitState
        >>> init_failure([S.WAITING, S.NOT_STARTED, S.WAITING], [0, 1, 2], 0, 5.0).split(": ranks")[0]
        'NCCL did not set up the GPU communicator of process set 0 (ranks [0, 1, 2]) within 5 s'
    """
    if all(s is InitState.DONE for s in states):
        return ""
    where = f"the GPU communicator of process set {process_set_id} (ranks {list(ranks)})"
    failed = [r for r, s in zip(ranks, states) if s is InitState.FAILED]
    if failed:
        return (f"NCCL could not set up {where}: ranks {failed} failed in ncclCommInitRank (their log "
                "has NCCL's error). Run with NCCL_DEBUG=INFO for NCCL's own report.")
    missing = [r for r, s in zip(ranks, states) if s is InitState.NOT_STARTED]
    waiting = [r for r, s in zip(ranks, states) if s is InitState.WAITING]
    head = f"NCCL did not set up {where} within {timeout_seconds:g} s"
    if missing:
        return (f"{head}: ranks {missing} never reached ncclCommInitRank (stuck selecting or starting "
                f"their GPU), ranks {waiting} waited there for them. Check that those ranks see a GPU "
                "(CUDA_VISIBLE_DEVICES) and that it is not busy or in an error state.")
    if waiting:
        return (f"{head}: every rank waited in ncclCommInitRank, so NCCL could not connect them. Run with "
                "NCCL_DEBUG=INFO; across hosts, check NCCL_SOCKET_IFNAME and that the hosts reach each "
                "other on the network NCCL picked.")
    return f"{head}: ranks {[r for r, s in zip(ranks, states) if s is not InitState.DONE]} have no communicator."
