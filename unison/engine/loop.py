"""The engine: one background thread per process that negotiates and executes every collective.

Framework threads call `Engine.enqueue` (returns at once); a cycle (status exchange, then the slow path
only if some rank has uncached work) executes the agreed responses in the agreed order and completes
the handles. See `unison.engine` for the cycle.

Who runs a cycle: one at a time runs, under the engine's cycle lock, on whichever thread needs it. A
thread that waits for a handle runs the cycles itself while no other thread is running one
(`Engine.drive`): a blocking call then costs no hand-off to the engine thread and back, which was most
of a small call's time (two thread wake-ups, each a trip through the scheduler, and on a machine with
as many busy threads as cores, sometimes a whole time slice). The engine thread runs the cycles
nobody waits in: work submitted asynchronously, a job's idle cycles (which let peers' cycles
complete), shutdown and aborts. Device (GPU) work always runs on the engine thread: its streams are
per thread.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ..backends.base import Abandoned, Backend
from ..config import Settings
from ..errors import (
    AbortedError,
    HorovodInternalError,
    ShutdownError,
)
from ..ops import Kind
from ..protocol.autotune import Parameters
from ..protocol.cache import CacheState, ResponseCache
from ..protocol.fusion import FusionPolicy
from ..protocol.messages import (
    Response,
)
from ..protocol.negotiation import Coordinator
from ..protocol.stall import StallInspector
from .autotuning import Autotuning, open_tune_log
from .cycles import Cycles
from .executor import Executor
from .handles import Entry, Handle, begin_main_wait, enter_main_cycle, leave_main_cycle, main_runs_a_cycle
from .observer import observe_all
from .queue import SubmissionQueue
from .stall_feed import StallFeed
from .state import EngineState, EngineStatistics

if TYPE_CHECKING:
    import numpy as np

    from ..protocol.messages import Request
    from .timeline import Timeline

__all__ = ["Engine", "EngineState", "EngineStatistics", "open_tune_log"]

log = logging.getLogger(__name__)
T = TypeVar("T")  # what a cycle returns (`Engine._guarded_cycle`)

_MAX_BACKOFF_SECONDS = 1e-3
_FIRST_BACKOFF_SECONDS = 50e-6
_MAIN_THREAD = threading.main_thread().ident
# the engine's counters that a steady call which ran alone adds one to (`Cycles.steady_calls`)
_STEADY_COUNTS = frozenset({"cycles", "fast_cycles", "driven_cycles", "cache_hits_executed", "responses"})
_CACHEABLE = Kind.ALLREDUCE
_REDUCING = (Kind.ALLREDUCE, Kind.REDUCESCATTER)  # what autotune scores


class Engine:
    """Owns the communication thread of one process.

    Args:
        backend: transport for control and data (see `unison.backends.base.Backend`).
        settings: the job's settings.
        process_sets: id -> sorted global ranks, registered identically on every rank.
        timeline: a `Timeline` on rank 0, or None.
    """

    def __init__(self, backend: Backend, settings: Settings,
                 process_sets: dict[int, tuple[int, ...]] | None = None,
                 timeline: Timeline | None = None, tune_log: TextIO | None = None) -> None:
        self.backend = backend
        self.settings = settings
        self.rank: int = backend.rank
        self.size: int = backend.size
        self.process_sets: dict[int, tuple[int, ...]] = dict(process_sets or {0: tuple(range(self.size))})
        self.cache = ResponseCache(settings.cache_capacity)
        self.executor = Executor(backend, self.rank, self.process_sets)
        self.executor.device_plane_options = {"operations": settings.gpu_operations,
                                              "init_timeout_seconds": settings.nccl_init_timeout_seconds,
                                              "use_cuda_aware_mpi": settings.cuda_aware_mpi}
        self.coordinator = Coordinator(self.size, self.process_sets) if self.rank == 0 else None
        self.stall = None
        self._stall_feed: StallFeed | None = None
        if self.coordinator is not None and not settings.stall_check_disable:
            self.stall = StallInspector(settings.stall_check_seconds, settings.stall_shutdown_seconds,
                                        deadlock_seconds=settings.deadlock_seconds)
            self._stall_feed = StallFeed(self.stall, self.coordinator, self.cache, self.process_sets,
                                         stop=self._announce_stop)
        # The knobs the autotuner may change while the job runs; every rank applies a change at the
        # end of the cycle whose responses carry it, so plans and caches stay equal.
        self.autotuning = Autotuning(settings, self.rank, tune_log)
        self.timeline: Timeline | None = None
        self._queue = SubmissionQueue(self._stopped_error)
        self._stats = {"cycles": 0, "fast_cycles": 0, "slow_cycles": 0, "driven_cycles": 0,
                       "cache_hits_executed": 0, "responses": 0, "errors": 0}
        policy = FusionPolicy(settings.fusion_threshold_bytes, settings.fusion_max_tensor_bytes,
                              group_only=settings.disable_group_fusion)
        # What a cycle does; the engine decides which thread runs one, one at a time under this lock.
        self._cycles = Cycles(backend, self.rank, self.process_sets, self.cache, self.executor, self._queue,
                              self.coordinator, self._stall_feed, self.autotuning, policy, self._stop, self._stats)
        self._cycle_lock = threading.Lock()
        self._backoff = _FIRST_BACKOFF_SECONDS
        self._device_seen = False  # a device buffer was submitted: cycles stay on the engine thread
        self._stop_error: BaseException | None = None
        self._stopped = threading.Event()
        self._disowned = False  # a forked child's copy: never talks to peers
        # Called once, from the thread that stopped the engine, with the error that stopped it and
        # whether someone waits on the job and gets the error: a pending handle was failed with it, or
        # the main thread runs the cycle (a blocking call's own, which raises it when the cycle ends).
        self.on_stop: Callable[[BaseException, bool], None] | None = None
        self._state = EngineState.CREATED
        self._thread = threading.Thread(target=self._run, name=f"unison-engine-{self.rank}",
                                        daemon=True)
        if timeline is not None:
            self.set_timeline(timeline)

    def __repr__(self) -> str:
        return (f"<Engine rank={self.rank}/{self.size} state={self._state} "
                f"pending={len(self._cycles.work.entries)} cache={len(self.cache)}>")

    @property
    def on_response(self) -> Callable[[Response], None] | None:
        """Called with each response just before it runs, in the job-wide order (fused responses as
        fused), on the thread that runs the cycle; for tools and tests that follow what the job executes."""
        return self._cycles.on_response

    @on_response.setter
    def on_response(self, hook: Callable[[Response], None] | None) -> None:
        self._cycles.on_response = hook

    @property
    def policy(self) -> FusionPolicy:
        """The fusion policy in effect (the autotuner changes its threshold; a benchmark may set it)."""
        return self._cycles.policy

    @policy.setter
    def policy(self, policy: FusionPolicy) -> None:
        self._cycles.policy = policy

    # -- public, called from framework threads ------------------------------------------------------

    @property
    def state(self) -> EngineState:
        """Lifecycle state: created, running, stopped."""
        return self._state

    @property
    def stop_error(self) -> BaseException | None:
        """The error the engine stopped with (None while running, or after an orderly shutdown)."""
        return self._stop_error

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait until the engine has stopped (shut down, aborted or failed); False on timeout."""
        return self._stopped.wait(timeout)

    @property
    def thread_alive(self) -> bool:
        """Whether the communication thread is running."""
        return self._thread.is_alive()

    def pending_names(self) -> list[str]:
        """Names this rank has submitted and the job has not run yet (a snapshot; any thread)."""
        return list(self._cycles.work.entries)

    @property
    def parameters(self) -> Parameters:
        """The parameters in effect: the settings', or the autotuner's latest (`Autotuning`)."""
        return self.autotuning.parameters

    def start(self) -> None:
        """Start the communication thread."""
        self._state = EngineState.RUNNING
        self._queue.open()
        self._thread.start()

    def statistics(self) -> EngineStatistics:
        """A snapshot of the counters of the engine and of its cache, executor, backend and coordinator."""
        queued, held = self._queue.counts()
        steady = self._cycles.steady_calls  # each counted once (`Cycles.steady_calls`)
        counts = {key: value + steady if key in _STEADY_COUNTS else value for key, value in self._stats.items()}
        cache, executor = self.cache.statistics(), self.executor.statistics()
        return EngineStatistics(
            **counts,
            rows_gathered=self._cycles.status.rows_gathered,
            queued=queued,
            held=held,
            cache=dataclasses.replace(cache, hits=cache.hits + steady),
            executor=dataclasses.replace(executor, responses=executor.responses + steady,
                                         tensors=executor.tensors + steady),
            backend=dict(self.backend.statistics()),
            coordinator=None if self.coordinator is None else self.coordinator.statistics(),
            stall=None if self.stall is None else self.stall.statistics(),
            autotune=self.autotuning.statistics(),
        )

    def enqueue(self, entries: Sequence[Entry], *, waits: bool = False) -> None:
        """Submit entries as one atomic group (one entry for an ordinary op).

        Args:
            entries: the group.
            waits: the submitting thread waits for them at once (a blocking call): its wait runs the
                cycle (`drive`), so the engine thread is not woken for them.

        Raises:
            DuplicateNameError: a name is already in flight on this rank.
            ShutdownError: the job has stopped.
        """
        if not self._device_seen and any(entry.request.device != "cpu" for entry in entries):
            self._device_seen = True
        self._queue.put(entries, wake=not waits or self._device_seen)

    def run_now(self, entry: Entry) -> bool:
        """Run `entry`'s cycle on the calling thread at once, when this rank has nothing else to do.

        For a blocking call of one allreduce on host buffers whose response is cached: the steady
        state (`_solo_cycle`). Returns False, having sent nothing, when the rank is busy (another
        thread runs a cycle, other work is queued or pending) or the call is not cached: the caller
        then submits it as usual. After True the entry's handle is done, or its cycle became a whole
        one and the handle waits for a later cycle like any other.
        """
        request = entry.request
        if (self._device_seen or self.parameters.cycle_time_seconds or request.device != "cpu"
                or request.kind is not _CACHEABLE):
            return False
        lock = self._cycle_lock
        if not lock.acquire(False):
            return False
        try:
            if self._state is not EngineState.RUNNING or not self._cycles.solo_ready():
                return False
            state, slot = self.cache.lookup(request, count=False)
            if state is not CacheState.HIT:
                return False
            unbatched = self._queue.claim_idle(request)
            if unbatched is None:
                return False
            # The main thread waits for this call from now on (as `SubmissionQueue.take` would see it).
            main = threading.get_ident() == _MAIN_THREAD
            if main:
                begin_main_wait()
            blocked = unbatched and main
            self.cache.count_hit()  # as a cycle's admission counts it
            self._stats["driven_cycles"] += 1
            self._guarded_cycle(self._cycles.solo, entry, slot, blocked)
            return True
        finally:
            lock.release()

    def run_steady(self, request: Request, source: np.ndarray, output: np.ndarray) -> Entry | bool:
        """`run_now` for a blocking host allreduce that made no entry (the steady state's NumPy call).

        Returns False, having sent nothing, where `run_now` would (busy, or not cached): the caller then
        submits as usual; True once the result is in `output`; or the entry the call became when its
        cycle turned into a whole one (the caller waits for its handle).
        """
        if self._device_seen or self.autotuning.parameters.cycle_time_seconds:
            return False
        lock = self._cycle_lock
        if not lock.acquire(False):
            return False
        try:
            if self._state is not EngineState.RUNNING or not self._cycles.solo_ready():
                return False
            slot = self.cache.hit_slot(request)
            if slot < 0:
                return False
            unbatched = self._queue.claim_idle(request)
            if unbatched is None:
                return False
            main = threading.get_ident() == _MAIN_THREAD
            if main:
                begin_main_wait()
            blocked = unbatched and main
            became = self._guarded_cycle(self._cycles.steady, request, source, output, slot, blocked, self.drive)
            if self._state is not EngineState.RUNNING and became is None and self._stop_error is not None:
                raise self._stopped_error()  # the cycle failed: its error, as a pending call gets it
            return True if became is None else became
        finally:
            lock.release()

    def drive(self, handle: Handle, deadline: float | None) -> None:
        """Run cycles on the calling thread until `handle` is done, while no other thread runs one.

        Returns when the handle is done, when the deadline (`time.monotonic`) has passed, or when
        another thread is running a cycle: the engine thread, woken here, then runs the next ones, and
        the caller waits for the handle as usual. Between cycles that made no progress (a peer has not
        submitted yet) it backs off as the engine thread does, from 50 us to 1 ms.
        """
        lock = self._cycle_lock
        backoff = _FIRST_BACKOFF_SECONDS
        while not handle._done:
            if (self._state is not EngineState.RUNNING or self._device_seen
                    or self.parameters.cycle_time_seconds):
                self._queue.wake()
                return
            if not lock.acquire(False):
                self._queue.wake()
                return
            try:
                if handle._done or self._state is not EngineState.RUNNING:
                    return
                self._stats["driven_cycles"] += 1
                self._guarded_cycle(self._cycles.driven)
                progress = self._cycles.progress
            finally:
                lock.release()
            if handle._done or (deadline is not None and time.monotonic() >= deadline):
                return
            if progress:
                backoff = _FIRST_BACKOFF_SECONDS
            else:
                if handle.wait_released(backoff):
                    return
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)

    def wake(self) -> None:
        """Make the engine thread run a cycle now (work that was submitted without waking it, and that
        nobody waits for yet)."""
        self._queue.wake()

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Hold what this thread submits inside the block and queue it all at once when the block ends.

        One cycle then sees every submission, so they are negotiated together and the small ones are
        fused, instead of a cycle starting on the first while the thread is still submitting the rest.
        Blocks may nest; the outermost one releases. If the engine stops meanwhile, the held entries
        fail like queued ones.
        """
        return self._queue.batch()

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Ask every rank to stop, wait for this rank's thread, and fail what is still pending.

        Returns False when the peers did not answer within `timeout` and they were left: the job is
        then broken (a control operation may never complete), and the caller must not wait for them
        again (see `unison._job.failure.job_broken`).
        """
        if self._state is EngineState.CREATED or self._disowned:
            self._state = EngineState.STOPPED
            return True
        self._queue.request_shutdown()
        if threading.current_thread() is self._thread:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("peers did not answer shutdown within %.0f s; leaving them.", timeout)
            self.backend.abandon()
            self._thread.join(2.0)
            return False
        return True

    def abort(self, reason: str, timeout: float = 2.0) -> bool:
        """Stop the whole job because this rank is failing; return True once every rank was told.

        The reason travels to the coordinator as a shutdown request that carries it; the coordinator
        answers with an abort response, which fails every pending handle on every rank with
        `AbortedError(reason)`. Returns False when the engine had already stopped or the answer did
        not come within `timeout` (a peer or the coordinator is unreachable): the caller then falls
        back to something blunter, such as MPI_Abort.
        """
        if self._state is not EngineState.RUNNING:
            return False
        self._queue.request_abort(reason)
        if threading.current_thread() is self._thread:
            return False
        self._stopped.wait(timeout)
        return isinstance(self._stop_error, AbortedError)

    def disown(self, error: BaseException) -> None:
        """Make this engine refuse all work in this process without a word to any peer.

        For a process forked after `init()`: the child shares the parent's memory, but not its engine
        thread or its place in the job. Every later call raises `error`; `shutdown()` does nothing.
        """
        self._state = EngineState.STOPPED
        self._stop_error = error
        self._queue.close(keep_batches=False)
        self._cycles.work.clear()
        self.on_stop = None
        self._disowned = True

    def _stopped_error(self) -> BaseException:
        """What a submission to a stopped engine raises: a copy of the stop's error, with its cause."""
        error = self._stop_error
        if error is None:
            return ShutdownError("unison has been shut down; no more collectives can run in this job.")
        fresh = copy.copy(error)
        fresh.__cause__, fresh.__traceback__ = error.__cause__, None
        return fresh

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._state is EngineState.RUNNING:
                self._wait_for_work()
                with self._cycle_lock:
                    if self._state is not EngineState.RUNNING:
                        break
                    # An idle cycle lets peers' cycles complete; one that a waiting thread ran since
                    # (`drive`) did that already, and took what woke this thread.
                    cycles = self._cycles
                    if not cycles.has_work() and time.monotonic() - cycles.started < self.settings.idle_cycle_seconds:
                        continue
                    self._guarded_cycle(cycles.run)
        finally:
            self._stop(ShutdownError("unison has been shut down; no more collectives can run."))
            try:
                try:
                    self._cycles.observer.close()  # the timeline's file
                finally:
                    self.autotuning.close()
            finally:
                try:
                    self.executor.close()  # the GPU data plane's communicators, if one was made
                finally:
                    self.backend.close()

    def _guarded_cycle(self, cycle: Callable[..., T], *args: Any) -> T | None:
        """Run one cycle, ``cycle(*args)`` (the cycle lock held); return what it returned, None where it
        failed (whether it made progress: ``self._cycles.progress``). A failure stops the engine: every
        waiter gets the error, whichever thread ran the cycle. On the main thread a SIGINT waits for the
        cycle's end (`handles.main_thread_cycle`): peers cannot finish a cycle left half way."""
        main = threading.get_ident() == _MAIN_THREAD
        if main:
            enter_main_cycle()
        try:
            return cycle(*args)
        except Abandoned:
            self._stop(ShutdownError("unison was shut down while peers did not respond."))
        except AbortedError as exc:  # the transport learned that the job is being aborted
            log.debug("%s", exc)  # reported once, by the failing rank and the launcher
            self._stop(exc)
        except Exception as exc:  # noqa: BLE001 - every waiter must fail, not hang on a dead cycle
            log.exception("engine failed")
            failure = HorovodInternalError(f"unison's engine failed on rank {self.rank}: {exc!r}")
            failure.__cause__ = exc  # raised in each waiting thread with it (`unison._job.calls`)
            self._stop(failure)
        except BaseException as exc:
            # KeyboardInterrupt or SystemExit in a thread that was running a cycle (`drive`): the
            # peers cannot finish that cycle with this rank, so the job stops; the thread gets its own.
            self._stop(HorovodInternalError(
                f"rank {self.rank} was interrupted ({type(exc).__name__}) while it ran a cycle of the job"))
            raise
        finally:
            if main and leave_main_cycle():
                # A SIGINT was held while the cycle ran (`handles.defer_interrupt`): deliver it now, to
                # the handler that held it, which decides what it raises (a stopped job's interrupt
                # is `JobInterrupt`, `unison._job.failure`; Ctrl-C a KeyboardInterrupt).
                signal.raise_signal(signal.SIGINT)
        return None

    def _wait_for_work(self) -> None:
        """Sleep until there is work, or until the idle interval passed without any."""
        cycles = self._cycles
        if self.parameters.cycle_time_seconds:
            # UNISON_CYCLE_TIME / HOROVOD_CYCLE_TIME (or the autotuner): a minimum time between cycle
            # starts, which lets more tensors gather into each cycle at the cost of latency.
            left = cycles.started + self.parameters.cycle_time_seconds - time.monotonic()
            if left > 0:
                time.sleep(left)
        if self._queue.has_work() or cycles.slow.news or cycles.work.unsent or self.autotuning.due:
            self._backoff = _FIRST_BACKOFF_SECONDS
            return
        if cycles.work.entries:
            if cycles.progress:
                self._backoff = _FIRST_BACKOFF_SECONDS
                return
            # Pending work that made no progress: everyone may be waiting on someone's compute.
            self._queue.wait(self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF_SECONDS)
        else:
            self._queue.wait(self.settings.idle_cycle_seconds)
        self._queue.clear_wake()

    def _stop(self, error: BaseException) -> None:
        """Fail everything pending or queued with `error` and mark the engine stopped."""
        if self._state is EngineState.STOPPED and self._stop_error is not None:
            error = self._stop_error
        first = self._stop_error is None
        if first:
            self._stop_error = error
        self._state = EngineState.STOPPED
        queued = self._queue.close()
        self._queue.wake()  # the engine thread, asleep while a waiting thread ran the cycles, ends too
        waiting = self._cycles.work.clear() + queued
        for entry in waiting:
            entry.handle.fail(error)  # one error for all: each waiter raises a copy (`unison._job.calls`)
        if first:
            self._stopped.set()
            if self.on_stop is not None:
                try:
                    self.on_stop(error, bool(waiting) or main_runs_a_cycle())
                except Exception:  # noqa: BLE001 - a failing hook must not keep the engine alive
                    log.exception("stop hook failed")

    def _announce_stop(self, text: str) -> None:
        """Rank 0: broadcast `text` as a job stop (a STALL response) in the next slow-path cycle."""
        self._cycles.slow.news = text

    # -- rank 0 only: the timeline ------------------------------------------------------------------

    def set_timeline(self, timeline: Timeline | None) -> None:
        """Start (or with None, stop) writing the timeline; rank 0 only."""
        old, self.timeline = self.timeline, timeline
        self._cycles.observer = observe_all(timeline)
        if timeline is None:
            self.executor.activity = None
        else:
            def activity(names: Sequence[str], what: str | None) -> None:
                for name in names:
                    if what is None:
                        timeline.activity_end(name)
                    else:
                        timeline.activity_start(name, what)
            self.executor.activity = activity
        if old is not None and old is not timeline:
            old.close()
