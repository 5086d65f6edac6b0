"""A GPU data plane without a GPU: a device whose arrays are NumPy's and which logs every operation in order.

`FakeDevice` runs the same arithmetic as the CuPy device (`ArrayDevice`, with NumPy as the array
module) and records each operation with the stream it was issued on, so tests check the stream rules
by reading the log. Events complete at once unless a stream is `hold`-ed, which models a producer
whose kernels are still running. `FakeLibrary` is NCCL for ranks that are threads of one process:
members of one unique id meet in a `_World` and reduce with NumPy (half precision widened to float32
and rounded once, which is close to, not bit-equal with, NCCL's ring).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

from ..dtypes import DType
from ..engine.numerics import REDUCERS, half_combiner
from ..ops import ReduceOp
from .device import Array, ArrayDevice, Stream

__all__ = ["FakeComm", "FakeDevice", "FakeEvent", "FakeLibrary", "FakeStream"]


class FakeStream:
    """A named stream of the fake device."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


class FakeEvent:
    """An event recorded on a fake stream; done at once unless its stream is held."""

    _ids = itertools.count(1)

    def __init__(self, stream: FakeStream, done: bool) -> None:
        self.id = next(self._ids)
        self.stream = stream
        self.done = done

    def __repr__(self) -> str:
        return f"<FakeEvent {self.id} on {self.stream.name} {'done' if self.done else 'pending'}>"


class FakeDevice(ArrayDevice):
    """A device over NumPy arrays that logs ``(operation, stream name, detail)`` tuples in `log`.

    Args:
        ordinal: the device number it reports.
        bus_id: its PCI bus id (tests give two ranks the same one to model a shared GPU).
    """

    xp: ModuleType = np

    def __init__(self, ordinal: int = 0, bus_id: str = "0000:00:00.0") -> None:
        self.ordinal = ordinal
        self.name = f"fake:{ordinal}"
        self._bus_id = bus_id
        self.log: list[tuple[str, str, object]] = []
        self._unison = FakeStream("unison")
        self._current = threading.local()
        self._held: set[str] = set()
        self._pending: list[FakeEvent] = []

    def __repr__(self) -> str:
        return f"<FakeDevice {self.ordinal} ops={len(self.log)}>"

    def _note(self, operation: str, stream: Stream, detail: object = None) -> None:
        self.log.append((operation, stream.name if stream is not None else "-", detail))

    def operations(self, *names: str) -> list[str]:
        """The logged operation names, only those in `names` when given."""
        return [op for op, _, _ in self.log if not names or op in names]

    # -- streams and events ---------------------------------------------------------------------
    def stream(self) -> FakeStream:
        return self._unison

    def current_stream(self, framework: str = "cupy") -> FakeStream:
        """The calling thread's stream of `framework`, named after it ("cupy", "torch")."""
        streams: dict[str, FakeStream] | None = getattr(self._current, "streams", None)
        if streams is None:
            streams = self._current.streams = {}
        if framework not in streams:
            streams[framework] = FakeStream(framework)
        return streams[framework]

    @contextmanager
    def using(self, stream: FakeStream, framework: str = "cupy") -> Iterator[FakeStream]:
        """Make `stream` the calling thread's current stream of `framework` inside the block."""
        self.current_stream(framework)
        streams: dict[str, FakeStream] = self._current.streams
        before = streams[framework]
        streams[framework] = stream
        try:
            yield stream
        finally:
            streams[framework] = before

    def hold(self, stream: FakeStream) -> None:
        """Leave events recorded on `stream` from now on pending (a producer still running)."""
        self._held.add(stream.name)

    def finish(self, stream: FakeStream) -> None:
        """Complete every pending event of `stream` and stop holding it."""
        self._held.discard(stream.name)
        for event in self._pending:
            if event.stream is stream:
                event.done = True
        self._pending = [e for e in self._pending if not e.done]

    def record_event(self, stream: FakeStream) -> FakeEvent:
        event = FakeEvent(stream, stream.name not in self._held)
        if not event.done:
            self._pending.append(event)
        self._note("record", stream, event.id)
        return event

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        self._note("wait", stream, event.id)

    def event_done(self, event: FakeEvent) -> bool:
        return event.done

    def synchronize_stream(self, stream: FakeStream) -> None:
        self._note("synchronize", stream)

    # -- host staging and identity --------------------------------------------------------------
    def to_host(self, buf: Array, stream: Stream) -> np.ndarray:
        self._note("to_host", stream)
        self.synchronize_stream(stream)
        return np.array(buf, copy=True).reshape(-1)

    def from_host(self, dst: Array, host: np.ndarray, stream: Stream) -> None:
        self._note("from_host", stream)
        dst.reshape(-1).view(np.uint8)[...] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)

    def bus_id(self) -> str:
        return self._bus_id


# -- NCCL for threads as ranks ----------------------------------------------------------------------

class _World:
    """The members of one fake communicator; `exchange` is a barrier that hands everyone every value."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._values: list[object] = [None] * size
        self._arrived = 0
        self._generation = 0
        # Any: each collective exchanges its own kind (an array, a list of pieces) and reads back that kind
        self._result: list[Any] = []

    def exchange(self, index: int, value: object, timeout_seconds: float = 60.0) -> list[Any]:
        with self._cond:
            generation = self._generation
            self._values[index] = value
            self._arrived += 1
            if self._arrived == self.size:
                self._result, self._values = self._values, [None] * self.size
                self._arrived = 0
                self._generation += 1
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: self._generation != generation, timeout_seconds):
                raise TimeoutError(f"fake NCCL member {index} waited {timeout_seconds} s for the others")
            return self._result


class FakeComm:
    """A member of a fake communicator; every collective is one exchange of NumPy arrays."""

    def __init__(self, world: _World, index: int, device: FakeDevice | None) -> None:
        self.world = world
        self.index = index
        self.device = device
        self.closed = False

    def __repr__(self) -> str:
        return f"<FakeComm {self.index}/{self.world.size}>"

    def _note(self, operation: str, stream: Stream) -> None:
        if self.device is not None:
            self.device._note("nccl." + operation, stream)

    def allreduce_(self, buf: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        self._note("allreduce", stream)
        values = np.stack(self.world.exchange(self.index, buf.reshape(-1).copy()))
        if dtype.is_half:  # float32 arithmetic, one rounding: the host executor's combine step
            buf.reshape(-1)[...] = half_combiner(dtype, op, 1.0, 1.0)(values).view(buf.dtype)
        else:
            buf.reshape(-1)[...] = REDUCERS[op](values, axis=0).astype(buf.dtype)

    def allgather(self, send: Array, recv: Array, stream: Stream) -> None:
        self._note("allgather", stream)
        recv[...] = np.concatenate(self.world.exchange(self.index, send.copy()))

    def allgatherv(self, send: Array, recv: Array, counts: Sequence[int], stream: Stream) -> None:
        self._note("allgatherv", stream)
        recv[: sum(counts)] = np.concatenate(self.world.exchange(self.index, send[: counts[self.index]].copy()))

    def broadcast_(self, buf: Array, root: int, stream: Stream) -> None:
        self._note("broadcast", stream)
        buf[...] = self.world.exchange(self.index, buf.copy())[root]

    def alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array, recv_counts: Sequence[int],
                  stream: Stream) -> None:
        self._note("alltoallv", stream)
        offsets = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
        pieces = [send[offsets[i] : offsets[i + 1]].copy() for i in range(len(send_counts))]
        everyone = self.world.exchange(self.index, pieces)
        mine = [everyone[sender][self.index] for sender in range(self.world.size)]
        recv[: sum(recv_counts)] = np.concatenate(mine)

    def reducescatter(self, send: Array, recv: Array, dtype: DType, op: ReduceOp, stream: Stream) -> None:
        self._note("reducescatter", stream)
        whole = send.reshape(-1).copy()
        self.allreduce_(whole, dtype, op, stream)
        count = recv.size
        recv.reshape(-1)[...] = whole[self.index * count : (self.index + 1) * count]

    def close(self) -> None:
        self.closed = True


class FakeLibrary:
    """NCCL for threads as ranks: a unique id names a world; `connect` joins it.

    One library object is shared by the threads of a test; `connected` counts the communicators made.
    """

    def __init__(self, version_code: int = 22005) -> None:
        self._worlds: dict[bytes, _World] = {}
        self._lock = threading.Lock()
        self._version = version_code
        self.connected = 0

    def unique_id(self) -> bytes:
        return os.urandom(128)

    # Any: the plane hands its `Device`; the fake communicator logs onto it, which only `FakeDevice` can
    def connect(self, unique_id: bytes, size: int, index: int, device: Any = None) -> FakeComm:
        with self._lock:
            world = self._worlds.setdefault(unique_id, _World(size))
            self.connected += 1
        world.exchange(index, None)  # like ncclCommInitRank, returns once every member joined
        return FakeComm(world, index, device)

    def version(self) -> int:
        return self._version
