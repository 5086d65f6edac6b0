"""The stream rules of the GPU data plane: nothing reads a buffer before the stream that writes it is done.

Four rules, each a small function over a `Device`, so the order they produce is unit-tested against the
fake device's log:

1. At submission, in the framework's thread, `mark_ready` records an event on the framework's
   current stream: the tensor's producer kernels were issued there before the collective was asked for.
2. Before unison reads inputs, `wait_for_inputs` makes unison's stream wait on each input's event.
   The host never waits: the wait is queued on the device, so a slow producer delays the collective
   and nothing else.
3. After unison wrote the results, `publish` records one event on unison's stream and attaches it to
   every result.
4. Before the framework reads a result, `consume` (in the framework's thread, when the handle is
   synchronized) makes the framework's current stream wait on that event.

No rule calls `cudaDeviceSynchronize`; only staging through host memory waits for a stream, since the
host itself then reads the bytes. `Retention` keeps the arrays a collective reads or writes alive until
its event completed, so a framework's caching allocator cannot hand their memory to a new tensor
while unison's stream still uses it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from .device import Device, DeviceBuffer

__all__ = ["Retention", "consume", "mark_ready", "publish", "wait_for_inputs"]


def mark_ready(device: Device, array: Any, framework: str = "cupy") -> DeviceBuffer:
    """Wrap `array` for submission with an event on the calling thread's current stream of `framework`,
    the library whose kernels produced it ("torch" or "cupy") (rule 1)."""
    return DeviceBuffer(array, device.record_event(device.current_stream(framework)), device.ordinal)


def wait_for_inputs(device: Device, stream: Any, buffers: Iterable[DeviceBuffer | None]) -> int:
    """Make `stream` wait on the ready event of every buffer, each distinct event once (rule 2).

    Returns how many waits were queued.
    """
    seen: set[int] = set()
    queued = 0
    for buffer in buffers:
        if buffer is None or buffer.ready is None or id(buffer.ready) in seen:
            continue
        seen.add(id(buffer.ready))
        device.wait_event(stream, buffer.ready)
        queued += 1
    return queued


def publish(device: Device, stream: Any, arrays: Sequence[Any]) -> tuple[Any, list[DeviceBuffer | None]]:
    """Record the event after unison's writes on `stream` and attach it to each result (rule 3).

    Returns the event and one `DeviceBuffer` per array (None stays None).
    """
    event = device.record_event(stream)
    return event, [None if a is None else DeviceBuffer(a, event, device.ordinal) for a in arrays]


def consume(device: Device, buffer: DeviceBuffer, framework: str = "cupy") -> Any:
    """Make the calling thread's current stream of `framework` wait for `buffer`; return its array (rule 4)."""
    if buffer.ready is not None:
        device.wait_event(device.current_stream(framework), buffer.ready)
    return buffer.array


class Retention:
    """Arrays kept alive until the event after their last use on unison's stream has completed.

    Events of one stream complete in the order they were recorded, so `release` stops at the first
    one still pending.

    Example:
        >>> from unison.gpu.fake import FakeDevice
        >>> device = FakeDevice()
        >>> keep = Retention(device)
        >>> keep.hold(device.record_event(device.stream()), ["buffer"])
        >>> keep.release(), len(keep)
        (1, 0)
    """

    def __init__(self, device: Device) -> None:
        self._device = device
        self._held: deque[tuple[Any, list[Any]]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"<Retention held={len(self._held)}>"

    def hold(self, event: Any, arrays: Sequence[Any]) -> None:
        """Keep `arrays` until `event` completed."""
        self._held.append((event, list(arrays)))

    def release(self) -> int:
        """Drop the arrays whose event completed; return how many groups were released."""
        released = 0
        while self._held and self._device.event_done(self._held[0][0]):
            self._held.popleft()
            released += 1
        return released
