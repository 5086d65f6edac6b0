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

import itertools
import threading
from collections import deque
from collections.abc import Hashable, Iterable, Sequence

from .device import Array, Device, DeviceBuffer, Event, Stream

__all__ = ["Retention", "consume", "forget_waits", "mark_ready", "publish", "wait_for_inputs"]


_records = itertools.count(1)
_record_lock = threading.Lock()  # numbers events in the order they are recorded, across threads
# (device, consumer stream key) -> (that stream, the last event it waited on); the stream is held so its
# handle cannot be reused by another stream while it is a key
_waited: dict[tuple[int, Hashable], tuple[Stream, Event]] = {}


def mark_ready(device: Device, array: Array, framework: str = "cupy") -> DeviceBuffer:
    """Wrap `array` for submission with an event on the calling thread's current stream of `framework`,
    the library whose kernels produced it ("torch" or "cupy") (rule 1)."""
    stream = device.current_stream(framework)
    with _record_lock:
        event = device.record_event(stream)
        number = next(_records)
    return DeviceBuffer(array, event, device.ordinal, (device.stream_key(stream), number, stream))


def wait_for_inputs(device: Device, stream: Stream, buffers: Iterable[DeviceBuffer | None]) -> int:
    """Make `stream` wait for the ready events of the buffers (rule 2); returns how many waits were queued.

    An event covers everything its stream ran before it, so of the events recorded on one producer
    stream only the last recorded is waited on (a DistributedOptimizer's gradients, each with its own
    event on the framework's stream, cost one wait per response); each other event is waited on once.
    """
    last: dict[Hashable, tuple[int, Event]] = {}  # producer stream -> (record number, event)
    events: dict[int, Event] = {}  # the events to wait on, each once
    for buffer in buffers:
        if buffer is None or buffer.ready is None:
            continue
        if buffer.producer is None:
            events[id(buffer.ready)] = buffer.ready
            continue
        key, number, _ = buffer.producer
        if key not in last or last[key][0] < number:
            last[key] = (number, buffer.ready)
    events.update((id(event), event) for _, event in last.values())
    for event in events.values():
        device.wait_event(stream, event)
    return len(events)


def publish(device: Device, stream: Stream, arrays: Sequence[Array | None]) -> tuple[Event, list[DeviceBuffer | None]]:
    """Record the event after unison's writes on `stream` and attach it to each result (rule 3).

    Returns the event and one `DeviceBuffer` per array (None stays None).
    """
    event = device.record_event(stream)
    return event, [None if a is None else DeviceBuffer(a, event, device.ordinal) for a in arrays]


def consume(device: Device, buffer: DeviceBuffer, framework: str = "cupy") -> Array:
    """Make the calling thread's current stream of `framework` wait for `buffer`; return its array (rule 4).

    The results of one response share one event: a stream that already waited on it does not wait
    again (a second wait on the same event orders nothing more).
    """
    if buffer.ready is not None:
        stream = device.current_stream(framework)
        key = (id(device), device.stream_key(stream))
        before = _waited.get(key)
        if before is None or before[1] is not buffer.ready:
            device.wait_event(stream, buffer.ready)
            _waited[key] = (stream, buffer.ready)
    return buffer.array


def forget_waits() -> None:
    """Drop what `consume` remembers of waits already made (at shutdown, with the devices)."""
    _waited.clear()


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
        self._held: deque[tuple[Event, list[Array]]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"<Retention held={len(self._held)}>"

    def hold(self, event: Event, arrays: Sequence[Array]) -> None:
        """Keep `arrays` until `event` completed."""
        self._held.append((event, list(arrays)))

    def release(self) -> int:
        """Drop the arrays whose event completed; return how many groups were released."""
        released = 0
        while self._held and self._device.event_done(self._held[0][0]):
            self._held.popleft()
            released += 1
        return released
