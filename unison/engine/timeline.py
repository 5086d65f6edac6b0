"""The timeline: a Chrome-trace / Perfetto JSON record of every collective, written by rank 0.

The format is Horovod's (``docs/timeline.rst``), so existing viewers and scripts keep working: a
JSON array that starts with metadata records for pid 0 carrying ``start_time_since_epoch_in_micros``;
every tensor name is its own "process" (a ``process_name`` and a ``process_sort_index`` record on
first sight); negotiation is a ``NEGOTIATE_<OP>`` B/E pair with one zero-length X event per rank
that submitted; execution is an ``<OP>`` B/E pair with nested activity pairs (``MPI_ALLREDUCE``,
``MEMCPY_IN_FUSION_BUFFER``...), closed by an E event carrying the dtype and shape. ``ts`` is in
integer microseconds since the timeline started.

The event methods are called by the engine thread only and sit on its hot path: each formats one
line and appends it to a deque, nothing more. A writer thread moves what the deque holds to the file
every `FLUSH_SECONDS` (0.05 s), so an operation shows in the file within about 0.05 s of running (plus
the write), inside the 0.1 s in which Horovod's timeline shows it, and a user can watch a live run;
the engine thread never waits on the file. While open, the file is a JSON array without its closing
``]``, which Chrome and Perfetto accept; `close` (callable from any thread) stops the writer, writes
what is left and adds the ``]``, so ``json.load`` reads the result.

Example:
    >>> tl = Timeline("/tmp/timeline.json")  # doctest: +SKIP
    >>> tl.negotiate_start("allreduce.loss", "allreduce")  # doctest: +SKIP
    >>> tl.negotiate_rank_ready("allreduce.loss", 0)  # doctest: +SKIP
    >>> tl.negotiate_end("allreduce.loss")  # doctest: +SKIP
    >>> tl.start("allreduce.loss", "allreduce")  # doctest: +SKIP
    >>> tl.end("allreduce.loss", "float32", (1,))  # doctest: +SKIP
    >>> tl.close()  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

from ..errors import ConfigError
from ..ops import Kind, TextEnum

if TYPE_CHECKING:
    from ..protocol.messages import Request, Response

__all__ = ["FLUSH_SECONDS", "Timeline", "TimelineState", "TimelineStatistics"]

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.05
"""How often the writer thread moves recorded events to the file."""

# Where each tensor is in its life, so that B/E events stay balanced even when the engine calls
# negotiate_start twice (a cache miss on a later cycle) or ends a tensor inside an activity.
_IDLE, _NEGOTIATING, _TOP_LEVEL, _ACTIVITY = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class TimelineStatistics:
    """Counters of a `Timeline`: events written, buffered and dropped, tensors seen, bytes, flushes."""

    events_written: int
    events_buffered: int
    events_dropped: int
    tensors_seen: int
    bytes_written: int
    flushes: int


class _Discarding(collections.deque):  # type: ignore[type-arg]
    """What a closed timeline records into: nothing is kept, each event counts as dropped."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self._timeline = timeline

    def append(self, line: str) -> None:
        self._timeline._events_dropped += 1


class TimelineState(TextEnum):
    """A timeline's lifecycle: open while it writes, then closed, or failed (a write error stopped it)."""

    OPEN = "open"
    CLOSED = "closed"
    FAILED = "failed"


class Timeline:
    """Write a Horovod-compatible Chrome-trace timeline of the collectives rank 0 coordinates.

    Only the engine thread may call the event methods (`negotiate_start` ... `mark_cycle`) and the
    `unison.engine.observer.CycleObserver` methods through which the engine reports its cycles
    (`cycle_started` ... `executed`, which call the event methods); `flush`, `close`, `statistics` and `repr` may be called from any thread. A writer thread, started
    here and stopped by `close`, writes the recorded events out every `flush_seconds`.

    Args:
        path: the file to write; it is created or truncated now.
        mark_cycles: emit a ``CYCLE_START`` instant event from every `mark_cycle` call.
        clock: seconds from an arbitrary origin, monotonic (injectable for tests).
        flush_seconds: the writer thread's period.

    Raises:
        ConfigError: the file cannot be opened for writing (missing directory, a directory, no
            permission...).
    """

    def __init__(
        self,
        path: str,
        mark_cycles: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self._path = path
        self._mark_cycles = mark_cycles
        self._clock = clock
        try:
            file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(
                f"The timeline file {path!r} cannot be opened for writing: {reason}. Give the path of "
                "a file in an existing, writable directory (UNISON_TIMELINE / HOROVOD_TIMELINE)."
            ) from exc
        self._lock = threading.Lock()
        self._state = TimelineState.OPEN
        self._origin = clock()
        start_micros = int(time.time() * 1_000_000)
        self._last_ts = 0
        # name -> [pid, state]; a list so the hot path mutates the state without a second lookup.
        self._tensors: dict[str, list[int]] = {}
        self._negotiating: set[str] = set()  # names in negotiation (`negotiated`)
        # Escaped JSON fragments for op and activity names, built once per distinct name.
        self._fragments: dict[str, str] = {}
        # Lines recorded and not yet written: the engine thread appends, whoever writes pops from the
        # left under `_lock` (a deque's append and popleft are atomic: the hot path takes no lock).
        self._pending: collections.deque[str] = collections.deque()
        self._events_written = 0
        self._events_dropped = 0
        self._flushes = 0
        header = (
            '[\n{"name":"process_name","ph":"M","pid":0,"args":{"start_time_since_epoch_in_micros":'
            f"{start_micros}}}}},\n"
            '{"name":"process_sort_index","ph":"M","pid":0,"args":{"sort_index":0}}'
        )
        try:
            file.write(header)
            file.flush()
        except OSError as exc:
            # Closing retries the failed write and fails the same way; the first error is the news.
            with contextlib.suppress(OSError):
                file.close()
            raise ConfigError(
                f"The timeline file {path!r} cannot be written: {exc.strerror or exc}. Give the path "
                "of a file on a writable file system (UNISON_TIMELINE / HOROVOD_TIMELINE)."
            ) from exc
        self._bytes_written = len(header)
        self._file: IO[str] | None = file
        self._flush_seconds = flush_seconds
        self._closing = threading.Event()
        self._writer = threading.Thread(target=self._write_periodically, name="unison-timeline",
                                        daemon=True)
        self._writer.start()

    @property
    def path(self) -> str:
        """The file this timeline writes."""
        return self._path

    @property
    def state(self) -> TimelineState:
        """``"open"``, ``"closed"``, or ``"failed"`` after a write error stopped the timeline."""
        return self._state

    def __repr__(self) -> str:
        return (
            f"<Timeline {self._state} path={self._path!r} tensors={len(self._tensors)} "
            f"events_written={self._events_written} buffered={len(self._pending)}>"
        )

    # ----------------------------------------------------------------------------------- events

    def negotiate_start(self, name: str, kind: str) -> None:
        """Open the ``NEGOTIATE_<KIND>`` span of tensor `name`; repeated calls while open are ignored.

        Args:
            name: the tensor's cross-rank name, e.g. ``allreduce.grad/fc1.weight``.
            kind: the collective, e.g. ``"allreduce"`` (upper-cased in the event name).
        """
        entry = self._entry(name)
        if entry[1] == _NEGOTIATING:
            return
        entry[1] = _NEGOTIATING
        self._begin(entry[0], "NEGOTIATE_" + str.upper(kind))

    def negotiate_rank_ready(self, name: str, rank: int) -> None:
        """Mark that `rank` submitted tensor `name` (a zero-length X event named after the rank)."""
        pid = self._entry(name)[0]
        ts = self._now()
        self._pending.append(f',\n{{"ph":"X","name":"{rank:d}","ts":{ts},"pid":{pid},"tid":0,"dur":0}}')

    def negotiate_end(self, name: str) -> None:
        """Close the negotiation span of tensor `name` (ignored if none is open)."""
        entry = self._entry(name)
        if entry[1] != _NEGOTIATING:
            return
        entry[1] = _IDLE
        self._finish(entry[0])

    def start(self, name: str, kind: str) -> None:
        """Open the execution span (``ALLREDUCE``, ``BROADCAST``...) of tensor `name`."""
        entry = self._entry(name)
        if entry[1] == _NEGOTIATING:
            self._finish(entry[0])
        elif entry[1] == _ACTIVITY:
            self._finish(entry[0])
            self._finish(entry[0])
        elif entry[1] == _TOP_LEVEL:
            self._finish(entry[0])
        entry[1] = _TOP_LEVEL
        self._begin(entry[0], str.upper(kind))

    def activity_start(self, name: str, activity: str) -> None:
        """Open a nested activity span (e.g. ``MPI_ALLREDUCE``); an open activity is closed first."""
        entry = self._entry(name)
        if entry[1] == _ACTIVITY:
            self._finish(entry[0])
        elif entry[1] != _TOP_LEVEL:
            # An activity outside an execution span would unbalance the viewer's stack.
            return
        entry[1] = _ACTIVITY
        self._begin(entry[0], activity)

    def activity_end(self, name: str) -> None:
        """Close the open activity span of tensor `name` (ignored if none is open)."""
        entry = self._entry(name)
        if entry[1] != _ACTIVITY:
            return
        entry[1] = _TOP_LEVEL
        self._finish(entry[0])

    def end(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        """Close the execution span of tensor `name` (and any open activity), noting dtype and shape.

        Args:
            name: the tensor's name.
            dtype: its element type, e.g. ``"float32"``.
            shape: its shape; written as ``"[3, 4]"``.
        """
        entry = self._entry(name)
        state = entry[1]
        if state != _TOP_LEVEL and state != _ACTIVITY:
            return
        pid = entry[0]
        if state == _ACTIVITY:
            self._finish(pid)
        entry[1] = _IDLE
        ts = self._now()
        args = self._fragments.get(dtype) or self._fragment(dtype)
        shape_text = "[" + ", ".join([str(dim) for dim in shape]) + "]"
        self._pending.append(
            f',\n{{"ph":"E","ts":{ts},"pid":{pid},"tid":0,'
            f'"args":{{"dtype":{args},"shape":"{shape_text}"}}}}'
        )

    def mark_cycle(self) -> None:
        """Mark the start of a cycle with a ``CYCLE_START`` instant event (when `mark_cycles` is set)."""
        if self._mark_cycles:
            ts = self._now()
            self._pending.append(f',\n{{"ph":"i","name":"CYCLE_START","ts":{ts},"pid":0,"tid":0,"s":"g"}}')

    # ------------------------------------------------- the engine's cycle (a CycleObserver)

    def cycle_started(self, now: float) -> None:
        """Mark the cycle (`mark_cycle`)."""
        self.mark_cycle()

    def negotiated(self, lists: Sequence[Sequence[Request]], responses: Sequence[Response]) -> None:
        """Open the negotiation span of each newly requested tensor, mark each rank's request, and
        close the spans of the tensors the responses name."""
        negotiating = self._negotiating
        for rank, requests in enumerate(lists):
            for request in requests:
                if request.kind is Kind.SHUTDOWN:
                    continue
                if request.name not in negotiating:
                    negotiating.add(request.name)
                    self.negotiate_start(request.name, request.kind.value)
                self.negotiate_rank_ready(request.name, rank)
        for response in responses:
            for name in response.names:
                if name in negotiating:
                    negotiating.discard(name)
                    self.negotiate_end(name)

    def executing(self, response: Response) -> None:
        """Open the execution span of each tensor of `response`."""
        kind = response.kind
        for name in response.names:
            self.start(name, kind)

    def executed(self, response: Response) -> None:
        """Close the execution span of each tensor of `response`, with its dtype and shape."""
        dtype = response.dtype.value
        for name, shape in zip(response.names, response.shapes or [()] * len(response.names)):
            self.end(name, dtype, tuple(shape))

    # -------------------------------------------------------------------------------- output

    def flush(self) -> None:
        """Write every recorded event to the file now (the writer thread does it every `flush_seconds`)."""
        with self._lock:
            self._write_locked(self._take_pending())

    def close(self) -> None:
        """Stop the writer, write the recorded events and the closing ``]``, and close the file; idempotent.

        Safe to call from any thread. Events recorded after (or racing with) `close` are dropped.
        """
        self._closing.set()
        if self._writer is not threading.current_thread():
            self._writer.join()
        with self._lock:
            if self._file is None:
                self._write_locked(self._take_pending())  # counted as dropped
                return
            self._write_locked(self._take_pending())
            # The engine may record a few more events before it lets this timeline go: count them.
            self._pending = _Discarding(self)
            file, self._file = self._file, None
            try:
                if self._state is TimelineState.OPEN:
                    file.write("\n]\n")
                    self._bytes_written += 3
                file.close()
            except OSError as exc:
                self._fail(exc)
            if self._state is TimelineState.OPEN:
                self._state = TimelineState.CLOSED

    def statistics(self) -> TimelineStatistics:
        """Return counters: events written, buffered and dropped, tensors seen, bytes, flushes."""
        return TimelineStatistics(
            events_written=self._events_written,
            events_buffered=len(self._pending),
            events_dropped=self._events_dropped,
            tensors_seen=len(self._tensors),
            bytes_written=self._bytes_written,
            flushes=self._flushes,
        )

    # ---------------------------------------------------------------------------------- helpers

    def _now(self) -> int:
        ts = int((self._clock() - self._origin) * 1_000_000)
        # Viewers need non-decreasing timestamps; an injected clock may not guarantee that.
        if ts < self._last_ts:
            return self._last_ts
        self._last_ts = ts
        return ts

    def _entry(self, name: str) -> list[int]:
        entry = self._tensors.get(name)
        if entry is None:
            entry = self._new_tensor(name)
        return entry

    def _new_tensor(self, name: str) -> list[int]:
        pid = len(self._tensors) + 1
        entry = [pid, _IDLE]
        self._tensors[name] = entry
        self._pending.append(
            f',\n{{"name":"process_name","ph":"M","pid":{pid},"args":{{"name":{json.dumps(name)}}}}}'
            f',\n{{"name":"process_sort_index","ph":"M","pid":{pid},"args":{{"sort_index":{pid}}}}}'
        )
        return entry

    def _fragment(self, text: str) -> str:
        fragment = json.dumps(text)
        self._fragments[text] = fragment
        return fragment

    def _begin(self, pid: int, event_name: str) -> None:
        ts = self._now()
        fragment = self._fragments.get(event_name) or self._fragment(event_name)
        self._pending.append(f',\n{{"ph":"B","name":{fragment},"ts":{ts},"pid":{pid},"tid":0}}')

    def _finish(self, pid: int) -> None:
        ts = self._now()
        self._pending.append(f',\n{{"ph":"E","ts":{ts},"pid":{pid},"tid":0}}')

    def _write_periodically(self) -> None:
        """The writer thread: every `flush_seconds` until `close`, write what was recorded."""
        while not self._closing.wait(self._flush_seconds):
            if self._pending:
                with self._lock:
                    self._write_locked(self._take_pending())

    def _take_pending(self) -> list[str]:
        """Pop every recorded line, oldest first (the caller holds `_lock`: one taker at a time)."""
        pending = self._pending
        return [pending.popleft() for _ in range(len(pending))]

    def _write_locked(self, lines: list[str]) -> None:
        if not lines:
            return
        if self._file is None or self._state is not TimelineState.OPEN:
            self._events_dropped += len(lines)
            return
        text = "".join(lines)
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as exc:
            self._events_dropped += len(lines)
            self._fail(exc)
            return
        # A tensor's first-sight metadata pair counts as one event.
        self._events_written += len(lines)
        self._bytes_written += len(text)  # ASCII only: names go through json.dumps
        self._flushes += 1

    def _fail(self, exc: OSError) -> None:
        # Profiling must not take training down: stop the timeline, say why once, keep running.
        if self._state is TimelineState.OPEN:
            logger.error(
                "Writing the timeline %r failed (%s); the timeline is stopped and further events "
                "are dropped.",
                self._path,
                exc,
            )
        self._state = TimelineState.FAILED
