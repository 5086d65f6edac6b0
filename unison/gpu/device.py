"""What the GPU data plane needs from a device: memory, streams, events and the arithmetic on buffers.

`Device` is the protocol; `ArrayDevice` implements everything that is arithmetic once, against an
array module (`xp`: CuPy on a GPU, NumPy for the fake), so the numerics of device packing and
scaling are the same code on CPU tests and on a GPU. Subclasses add streams and events: `CupyDevice`
(`unison.gpu.cupy_device`, imported only when a CUDA buffer arrives) and `FakeDevice`
(`unison.gpu.fake`, which records the order of operations for tests).

The numerics are the host executor's, the same code: `unison.engine.numerics` over the device's array
module (float32/float64 scale in their own precision, integers through float64 truncated toward zero,
float16 and bfloat16 widened to float32, scaled and rounded once; bfloat16 as uint16 bits).

A `DeviceBuffer` carries a device array through the engine together with the event after which its
contents are valid: on the way in, an event on the framework's stream at submission; on the way out,
an event on unison's stream after the result was written (see `unison.gpu.ordering`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from ..dtypes import DType
from ..engine import numerics
from ..engine.numerics import raw

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["Array", "ArrayDevice", "Device", "DeviceBuffer", "Event", "Stream", "raw"]

# CuPy's types, by role. CuPy is imported only when the first CUDA buffer arrives (`lazy_cupy`), so its
# classes cannot be spelled in annotations; under the fake device they are NumPy arrays and the fake's
# own stream and event objects.
Array: TypeAlias = Any  # a device array: cupy.ndarray (numpy.ndarray under the fake device)
Stream: TypeAlias = Any  # a CUDA stream: cupy.cuda.Stream or ExternalStream (the fake's stream object)
Event: TypeAlias = Any  # a CUDA event: cupy.cuda.Event (the fake's event object)


@dataclasses.dataclass(eq=False)
class DeviceBuffer:
    """A device array on its way through the engine, with the event that makes it safe to read.

    The attributes the submit path checks on a NumPy buffer (`shape`, `flags`, `dtype`, `nbytes`)
    are the array's, so a `DeviceBuffer` travels where a NumPy buffer does.

    Attributes:
        array: the device array (CuPy, or NumPy under the fake device); bfloat16 as uint16 bits.
        ready: an event recorded on the producing stream, or None when nothing is pending.
        ordinal: the device the array lives on.
        producer: which stream `ready` was recorded on and when, as (stream key, record number,
            the stream itself), or None when unknown: of several events of one stream, waiting on
            the last is enough. The stream is held so that its handle, the key, cannot be given to
            another stream while this buffer is pending.
    """

    array: Array
    ready: Event | None = None
    ordinal: int = 0
    producer: tuple[Hashable, int, Stream] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def flags(self) -> Any:  # Any: CuPy's flags object on a GPU (NumPy's under the fake device)
        return self.array.flags

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def size(self) -> int:
        return int(self.array.size)

    def __repr__(self) -> str:
        return f"<DeviceBuffer device={self.ordinal} shape={self.shape} dtype={self.dtype}>"


class Device(Protocol):
    """One GPU as the data plane uses it: allocation, copies, scaling, fusion packing, streams, events."""

    name: str
    ordinal: int
    xp: ModuleType

    def stream(self) -> Stream:
        """unison's own stream on this device (one; all data-plane work is ordered on it)."""

    def stream_key(self, stream: Stream) -> Hashable:
        """What identifies `stream` on this device (the handle; two objects for one stream compare equal)."""

    def current_stream(self, framework: str = "cupy") -> Stream:
        """The calling thread's current stream in `framework` ("torch" or "cupy"): the stream its
        producer kernels were issued on, or its consumer's will be."""

    def record_event(self, stream: Stream) -> Event:
        """Record an event on `stream` and return it."""

    def wait_event(self, stream: Stream, event: Event) -> None:
        """Make later work on `stream` wait for `event`; the host does not wait."""

    def event_done(self, event: Event) -> bool:
        """Whether the work before `event` has finished (never blocks)."""

    def synchronize_stream(self, stream: Stream) -> None:
        """Block the host until `stream` is idle (staging through host memory only)."""

    def allocate(self, nbytes: int) -> Array:
        """A new flat uint8 device array of `nbytes`."""

    def empty(self, shape: Sequence[int], dtype: DTypeLike, stream: Stream) -> Array:
        """A new device array for results, allocated for use on `stream`."""

    def copy_(self, dst: Array, src: Array, stream: Stream) -> None:
        """Copy the bytes of `src` into `dst` (same byte size) on `stream`."""

    def scale_(self, buf: Array, factor: float, dtype: DType, stream: Stream) -> None:
        """Multiply `buf` in place by `factor` with the per-dtype rules, on `stream`."""

    def copy_scaled_(self, dst: Array, src: Array, factor: float, dtype: DType, stream: Stream) -> None:
        """Write ``src * factor`` into `dst`, on `stream`."""

    def pack(self, buf: Array, parts: Sequence[Array | None], counts: Sequence[int], factor: float,
             dtype: DType, stream: Stream) -> None:
        """Copy `parts` (storage dtype) one after another into `buf`, scaled; a None part is `counts[i]` zeros
        (a joined rank's contribution)."""

    def unpack(self, buf: Array, outputs: Sequence[Array | None], counts: Sequence[int], stream: Stream) -> None:
        """Copy consecutive pieces of `counts[i]` elements of `buf` into `outputs[i]` (None: skipped)."""

    def to_host(self, buf: Array, stream: Stream) -> np.ndarray:
        """Copy `buf` into host memory (pinned on a GPU) and wait for it; returns a flat array."""

    def from_host(self, dst: Array, host: np.ndarray, stream: Stream) -> None:
        """Copy `host` into `dst` on `stream`."""

    def bus_id(self) -> str:
        """The device's PCI bus id (unique on its host)."""


class ArrayDevice:
    """The arithmetic of `Device` over an array module; subclasses supply streams and events.

    `_on(stream)` is the context in which an operation's kernels are issued (CuPy: ``with stream``);
    `_note` is called with each operation's name and stream, before it is issued.
    """

    name = "array"
    ordinal = 0
    xp: ModuleType = np

    @contextmanager
    def _on(self, stream: Stream) -> Iterator[None]:
        yield

    def stream_key(self, stream: Stream) -> Hashable:
        return getattr(stream, "ptr", id(stream))

    def _note(self, operation: str, stream: Stream, detail: object = None) -> None:
        """Hook for the fake device's log; a real device does nothing."""

    # -- memory ---------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Array:
        self._note("allocate", None, nbytes)
        return self.xp.empty(nbytes, dtype=self.xp.uint8)

    def empty(self, shape: Sequence[int], dtype: DTypeLike, stream: Stream) -> Array:
        with self._on(stream):
            return self.xp.empty(tuple(shape), dtype=dtype)

    def copy_(self, dst: Array, src: Array, stream: Stream) -> None:
        self._note("copy", stream)
        with self._on(stream):
            raw(dst)[...] = raw(src)

    # -- arithmetic (unison.engine.numerics, over this device's array module) ------------------
    def widen(self, values: Array, dtype: DType) -> Array:
        """float16 values or bfloat16 bits -> float32 (a new flat array)."""
        return numerics.widen(values, dtype, self.xp)

    def narrow(self, values: Array, dtype: DType) -> Array:
        """float32 -> float16 or bfloat16 bits (uint16, flat; round to nearest even, NaN stays NaN)."""
        return numerics.narrow(values, dtype, self.xp)

    def scale_(self, buf: Array, factor: float, dtype: DType, stream: Stream) -> None:
        if factor == 1.0:
            return
        self._note("scale", stream, factor)
        with self._on(stream):
            numerics.scale_(buf, factor, dtype, self.xp)

    def copy_scaled_(self, dst: Array, src: Array, factor: float, dtype: DType, stream: Stream) -> None:
        if factor == 1.0:
            self.copy_(dst, src, stream)
            return
        self._note("copy_scaled", stream, factor)
        with self._on(stream):
            numerics.copy_scaled_(dst, src, factor, dtype, self.xp)

    # -- fusion ---------------------------------------------------------------------------------
    def pack(self, buf: Array, parts: Sequence[Array | None], counts: Sequence[int], factor: float,
             dtype: DType, stream: Stream) -> None:
        self._note("pack", stream, len(parts))
        with self._on(stream):
            offset = 0
            for part, count in zip(parts, counts):
                target = buf[offset : offset + count]
                if part is None:
                    target[...] = 0
                elif factor == 1.0:
                    raw(target)[...] = raw(part)
                else:
                    numerics.copy_scaled_(target, part, factor, dtype, self.xp)
                offset += count

    def unpack(self, buf: Array, outputs: Sequence[Array | None], counts: Sequence[int], stream: Stream) -> None:
        self._note("unpack", stream, len(outputs))
        with self._on(stream):
            offset = 0
            for out, count in zip(outputs, counts):
                if out is not None:
                    raw(out)[...] = raw(buf[offset : offset + count])
                offset += count
