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
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from ..backends.base import Abandoned, Backend
from ..config import Settings
from ..errors import (
    AbortedError,
    HorovodInternalError,
    MismatchError,
    ShutdownError,
    StallError,
)
from ..ops import Kind, TextEnum
from ..protocol.autotune import AutotuneStatistics, Parameters, Proposal, split_tuning
from ..protocol.cache import CacheState, CacheStatistics, ResponseCache
from ..protocol.cycle import Summary, bits, needs_slow_path, read_votes, solo_runs, words_for
from ..protocol.dispatch import ROUTES, Action
from ..protocol.fusion import FusionPolicy, plan_fusion
from ..protocol.messages import (
    Request,
    Response,
    WireError,
    decode_request_lists,
    decode_responses,
    encode_requests,
    encode_responses,
)
from ..protocol.negotiation import Coordinator, CoordinatorStatistics
from ..protocol.stall import StallInspector, StallStatistics
from .autotuning import Autotuning, open_tune_log
from .executor import Executor, ExecutorStatistics
from .handles import Entry, Handle
from .observer import CycleObserver, observe_all
from .pending import PendingWork
from .queue import Drained, SubmissionQueue
from .stall_feed import StallFeed
from .status import StatusExchange

if TYPE_CHECKING:
    from .timeline import Timeline

__all__ = ["Engine", "EngineState", "EngineStatistics", "open_tune_log"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 1e-3
_FIRST_BACKOFF_SECONDS = 50e-6
_MAIN_THREAD = threading.main_thread().ident
_CACHEABLE = Kind.ALLREDUCE
_REDUCING = (Kind.ALLREDUCE, Kind.REDUCESCATTER)  # what autotune scores


@dataclasses.dataclass(frozen=True)
class EngineStatistics:
    """A snapshot of an `Engine`'s counters and those of the parts it drives.

    `dataclasses.asdict` turns it into plain, JSON-ready data. `queued` counts submissions waiting
    for the engine thread, `held` those inside `batch()` blocks still open. `backend` holds the
    selected backend's own counters (they differ by backend: bytes moved, liveness probes, service
    calls); `coordinator` and `stall` are present on rank 0 only; `autotune` on every rank when
    ``UNISON_AUTOTUNE`` is on (the same on every rank: changes are applied at the same cycle).
    """

    cycles: int
    fast_cycles: int
    slow_cycles: int
    driven_cycles: int
    rows_gathered: int
    cache_hits_executed: int
    responses: int
    errors: int
    queued: int
    held: int
    cache: CacheStatistics
    executor: ExecutorStatistics
    backend: dict[str, float]
    coordinator: CoordinatorStatistics | None = None
    stall: StallStatistics | None = None
    autotune: AutotuneStatistics | None = None


class EngineState(TextEnum):
    """An engine's lifecycle: created, then running once started, then stopped for good.

    A `str` mixin, so a state compares equal to its value (``EngineState.RUNNING == "running"``).
    """

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


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
        self.policy = FusionPolicy(settings.fusion_threshold_bytes, settings.fusion_max_tensor_bytes,
                                   group_only=settings.disable_group_fusion)
        # The knobs the autotuner may change while the job runs; every rank applies a change at the
        # end of the cycle whose responses carry it (`_apply_tuning`), so plans and caches stay equal.
        self.autotuning = Autotuning(settings, self.rank, tune_log)
        self.timeline: Timeline | None = None
        # What the loop reports each step of a cycle to: rank 0's stall feed and timeline, if any.
        self._observer: CycleObserver = observe_all(self._stall_feed)
        self._queue = SubmissionQueue(self._stopped_error)
        self._work = PendingWork(self.rank, self.cache, self.process_sets)  # drained, not yet executed
        self._news: str = ""  # rank 0: a stall report to broadcast as a job stop
        self._progress = False
        self._backoff = _FIRST_BACKOFF_SECONDS
        self._cycle_started = 0.0
        self._status = StatusExchange(backend)
        # One cycle at a time, on the engine thread or on a thread that waits (`drive`).
        self._cycle_lock = threading.Lock()
        self._detail = False  # rank 0: its stall feed asked for every rank's row in the next cycle
        self._device_seen = False  # a device buffer was submitted: cycles stay on the engine thread
        self._stop_error: BaseException | None = None
        self._stopped = threading.Event()
        self._disowned = False  # a forked child's copy: never talks to peers
        # Called once, from the thread that stopped the engine, with the error that stopped it and
        # whether a pending handle was failed with it (a framework thread was waiting on the job).
        self.on_stop: Callable[[BaseException, bool], None] | None = None
        # Called on the engine thread with each response just before it runs, in the job-wide order
        # (fused responses as fused); for tools and tests that follow what the job executes.
        self.on_response: Callable[[Response], None] | None = None
        self._state = EngineState.CREATED
        self._thread = threading.Thread(target=self._run, name=f"unison-engine-{self.rank}",
                                        daemon=True)
        # What each `Action` of `unison.protocol.dispatch` calls (True: the job goes on), and from it
        # what each kind of response calls, with whether only members of its process set act on it.
        actions: dict[Action, Callable[[Response], bool]] = {
            Action.STOP_SHUTDOWN: self._stop_shutdown,
            Action.STOP_STALL: self._stop_stall,
            Action.STOP_ABORT: self._stop_abort,
            Action.FAIL: self._fail,
            Action.JOIN: self._end_join,
            Action.ADD_PROCESS_SET: self._add_process_set,
            Action.REMOVE_PROCESS_SET: self._remove_process_set,
            Action.BARRIER: self._barrier,
            Action.RUN: self._run_collective,
            Action.TUNE: self._ignore,
        }
        # Keyed by the kind's string: a str hashes in C, an enum member through Python (per response).
        self._dispatch: dict[str, tuple[Callable[[Response], bool], bool]] = {
            kind.value: (actions[route.action], route.members_only) for kind, route in ROUTES.items()
        }
        if timeline is not None:
            self.set_timeline(timeline)
        self._stats = {"cycles": 0, "fast_cycles": 0, "slow_cycles": 0, "driven_cycles": 0,
                       "cache_hits_executed": 0, "responses": 0, "errors": 0}

    def __repr__(self) -> str:
        return (f"<Engine rank={self.rank}/{self.size} state={self._state} pending={len(self._work.entries)} "
                f"cache={len(self.cache)}>")

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
        return list(self._work.entries)

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
        return EngineStatistics(
            **self._stats,
            rows_gathered=self._status.rows_gathered,
            queued=queued,
            held=held,
            cache=self.cache.statistics(),
            executor=self.executor.statistics(),
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
            work = self._work
            if (self._state is not EngineState.RUNNING or work.entries or work.joined or self._news
                    or self._detail or self.autotuning.due or self.autotuning.measuring
                    or not self._cache_on() or not self._status.reduces):
                return False
            state, slot = self.cache.lookup(request, count=False)
            if state is not CacheState.HIT:
                return False
            unbatched = self._queue.claim_idle(entry)
            if unbatched is None:
                return False
            # The main thread waits for this call from now on (as `SubmissionQueue.take` would see it).
            blocked = unbatched and threading.get_ident() == _MAIN_THREAD
            self.cache.lookup(request)  # counted as a cycle's admission counts it
            self._stats["driven_cycles"] += 1
            self._guarded_cycle(lambda: self._solo_cycle(entry, slot, blocked))
            return True
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
                progress = self._guarded_cycle(self._driven_cycle)
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
        self._work.clear()
        self.on_stop = None
        self._disowned = True

    def _stopped_error(self) -> BaseException:
        if self._stop_error is not None:
            return type(self._stop_error)(str(self._stop_error))
        return ShutdownError("unison has been shut down; no more collectives can run in this job.")

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
                    if (not self._has_work() and
                            time.monotonic() - self._cycle_started < self.settings.idle_cycle_seconds):
                        continue
                    self._guarded_cycle(self._cycle)
        finally:
            self._stop(ShutdownError("unison has been shut down; no more collectives can run."))
            try:
                try:
                    self._observer.close()  # the timeline's file
                finally:
                    self.autotuning.close()
            finally:
                try:
                    self.executor.close()  # the GPU data plane's communicators, if one was made
                finally:
                    self.backend.close()

    def _guarded_cycle(self, cycle: Callable[[], None]) -> bool:
        """Run one cycle (the cycle lock held); return whether it made progress. A failure stops the
        engine: every waiter gets the error, whichever thread ran the cycle."""
        try:
            cycle()
        except Abandoned:
            self._stop(ShutdownError("unison was shut down while peers did not respond."))
        except AbortedError as exc:  # the transport learned that the job is being aborted
            log.error("%s", exc)
            self._stop(exc)
        except Exception as exc:  # noqa: BLE001 - every waiter must fail, not hang on a dead cycle
            log.exception("engine failed")
            self._stop(HorovodInternalError(f"unison's engine failed on rank {self.rank}: {exc!r}"))
        except BaseException as exc:
            # KeyboardInterrupt or SystemExit in a thread that was running a cycle (`drive`): the
            # peers cannot finish that cycle with this rank, so the job stops; the thread gets its own.
            self._stop(HorovodInternalError(
                f"rank {self.rank} was interrupted ({type(exc).__name__}) while it ran a cycle of the job"))
            raise
        return self._progress

    def _has_work(self) -> bool:
        """Whether a cycle now has something to send or run (else it would be an idle cycle)."""
        return bool(self._queue.has_work() or self._news or self._work.unsent or self._work.entries
                    or self.autotuning.due)

    def _wait_for_work(self) -> None:
        """Sleep until there is work, or until the idle interval passed without any."""
        if self.parameters.cycle_time_seconds:
            # UNISON_CYCLE_TIME / HOROVOD_CYCLE_TIME (or the autotuner): a minimum time between cycle
            # starts, which lets more tensors gather into each cycle at the cost of latency.
            left = self._cycle_started + self.parameters.cycle_time_seconds - time.monotonic()
            if left > 0:
                time.sleep(left)
        if self._queue.has_work() or self._news or self._work.unsent or self.autotuning.due:
            self._backoff = _FIRST_BACKOFF_SECONDS
            return
        if self._work.entries:
            if self._progress:
                self._backoff = _FIRST_BACKOFF_SECONDS
                return
            # Pending work that made no progress: everyone may be waiting on someone's compute.
            self._queue.wait(self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF_SECONDS)
        else:
            self._queue.wait(self.settings.idle_cycle_seconds)
        self._queue.clear_wake()

    def _cache_on(self) -> bool:
        return self.settings.cache_capacity > 0 and self.parameters.cache_enabled

    # -- one cycle: exchange, decide, act -----------------------------------------------------------

    def _cycle(self, drained: Drained | None = None) -> None:
        """One cycle of the job: exchange, decide, act (`drained`: what a waiting thread already took
        from the queue, `_driven_cycle`)."""
        self._stats["cycles"] += 1
        now = self._cycle_started = time.monotonic()
        self._observer.cycle_started(now)
        if drained is None:
            drained = self._queue.take()
        self._work.admit(drained.groups, self._cache_on())

        # 1. Exchange status: a summary of votes and flags, and every rank's row when it is needed.
        payload, words, summary, matrix = self._exchange_status(drained)
        self._decide_and_act(now, bool(drained.groups), payload, words, summary, matrix)

    def _driven_cycle(self) -> None:
        """The cycle a waiting thread runs (`drive`): when its one cached allreduce is all this rank
        has to do, the steady state's cycle (`_solo_cycle`); otherwise a whole one."""
        drained = self._queue.take()
        groups = drained.groups
        if (len(groups) == 1 and len(groups[0]) == 1 and not drained.shutdown and not drained.abort_reason
                and not self._work.entries and not self._work.joined and not self._news and not self._detail
                and not self.autotuning.due and not self.autotuning.measuring and self._cache_on()):
            entry = groups[0][0]
            request = entry.request
            if request.kind is _CACHEABLE and request.device == "cpu" and self._status.reduces:
                state, slot = self.cache.lookup(request, count=False)
                if state is CacheState.HIT:
                    self.cache.lookup(request)  # counted as the whole cycle's admission would
                    self._solo_cycle(entry, slot, drained.blocked)
                    return
        self._cycle(drained)

    def _solo_cycle(self, entry: Entry, slot: int, blocked: bool) -> None:
        """The steady state's cycle: this rank's only work is one allreduce whose response is cached.

        The same cycle as `_cycle` (the same summary goes out, the same decision comes back), with the
        general bookkeeping skipped when the summary says that this slot alone runs, which is what
        every rank sees when every rank submitted the same call: then it runs here at once.
        """
        self._stats["cycles"] += 1
        now = self._cycle_started = time.monotonic()
        self._observer.cycle_started(now)
        work = self._work
        entry.slot = slot
        work.entries[entry.request.name] = entry
        work.invalid = 0
        words = words_for(self.cache.num_slots)
        foreign = work.foreign()
        summary = self._status.reduce_solo(slot, foreign, blocked, words)
        if solo_runs(summary, slot):
            if self._stall_feed is not None and self._stall_feed.due(now):
                self._detail = self._stall_feed.voted(now, summary, None, None)
            self._stats["fast_cycles"] += 1
            self._stats["cache_hits_executed"] += 1
            if self._execute(self.cache.get(slot)):
                self._progress = True
            return
        matrix = None
        if summary.needs_rows:
            matrix = self._status.rows(joined=False, news=False, blocked=blocked, payload_bytes=0,
                                       hits=(1 << slot) | foreign, invalid=0, words=words)
        self._decide_and_act(now, True, b"", words, summary, matrix)

    def _decide_and_act(self, now: float, progress: bool, payload: bytes, words: int, summary: Summary,
                        matrix: list[list[int]] | None) -> None:
        """Steps 2 to 5 of a cycle, once its status is exchanged (`unison.engine`)."""

        # 2. Decide, from the exchange alone: the fast path runs the slots every rank voted for without
        # asking the coordinator; the slow path runs only when some rank has requests the cache
        # could not answer. The summary decides; rows, where gathered, also feed the stall inspector.
        cached: list[Response] = [self.cache.get(slot) for slot in summary.runnable()]
        if cached:
            self._stats["cache_hits_executed"] += len(cached)
        if self._stall_feed is not None:
            votes = None if matrix is None else read_votes(matrix, words)
            self._detail = self._stall_feed.voted(now, summary, votes, matrix)
        fresh: list[Response] = []
        tuning: Proposal | None = None
        if matrix is not None and needs_slow_path(matrix):
            self._stats["slow_cycles"] += 1
            fresh, tuning = self._slow_path(payload, matrix, now)
        else:
            self._stats["fast_cycles"] += 1

        # 3. Act: execute, in the same order on every rank.
        measuring = self.autotuning.measuring
        executed, reduced_bytes = self._execute_all(cached + fresh, measuring)
        if executed < 0:
            return
        self._progress = progress or executed > 0

        # 4. Update the cache identically everywhere. Only now: an erase or eviction must not send
        # back to negotiation a tensor that ran from the cache in this very cycle.
        if summary.invalid:
            self.cache.erase(bits(summary.invalid))
        cacheable = [r for r in fresh if r.kind is _CACHEABLE and len(r.names) == 1]
        if self._cache_on():
            for response in cacheable:
                self.cache.put(response)
        if summary.invalid or cacheable:
            self._work.revalidate()

        # 5. Autotune: apply a new parameter set at this same point on every rank; rank 0 measures.
        if tuning is not None:
            self._apply_tuning(tuning)
        if measuring:
            self.autotuning.measure(reduced_bytes, now, restart=tuning is not None)

    def _exchange_status(self, drained: Drained) -> tuple[bytes, int, Summary, list[list[int]] | None]:
        """Exchange this rank's status: return (payload, words, summary, every rank's rows or None)."""
        requests = self._work.take_unsent()
        if drained.abort_reason:
            requests.append(Request("shutdown", Kind.SHUTDOWN, self.rank, reason=drained.abort_reason))
        elif drained.shutdown:
            requests.append(Request("shutdown", Kind.SHUTDOWN, self.rank))
        payload = encode_requests(requests) if requests else b""
        words = words_for(self.cache.num_slots)
        work = self._work
        # A parameter change of the autotuner is news too: it travels with this cycle's responses.
        news = bool(self._news) or self.autotuning.due
        summary, matrix = self._status.exchange(
            joined=work.joined, news=news, blocked=drained.blocked, detail=self._detail,
            payload_bytes=len(payload), hits=work.hits(), own=work.own_hits(), invalid=work.invalid,
            words=words)
        self._detail = False
        return payload, words, summary, matrix

    def _slow_path(self, payload: bytes, matrix: list[list[int]],
                   now: float) -> tuple[list[Response], Proposal | None]:
        """Gather the request lists to rank 0, which negotiates; broadcast its answer to every rank."""
        gathered = self.backend.gather_bytes(payload, [row[1] for row in matrix])
        data: bytes | None = None
        if self.coordinator is not None:
            assert gathered is not None
            data = encode_responses(self._negotiate(gathered, now))
        return split_tuning(decode_responses(self.backend.broadcast_bytes(data)))

    def _negotiate(self, gathered: list[bytes], now: float) -> list[Response]:
        """Rank 0: decide this cycle's responses from every rank's payload.

        Whatever goes wrong here (a payload rank 0 cannot read, a fault in the coordinator) becomes an
        abort response carrying the cause, so every rank stops with the reason instead of waiting
        for a rank 0 whose engine has died.
        """
        assert self.coordinator is not None
        try:
            lists = decode_request_lists(gathered)
            if self._news:
                responses = [Response(Kind.STALL, (), message=self._news)]
                self._news = ""
            else:
                responses = self.coordinator.handle(lists, now)
                tune = self.autotuning.take_due()
                if tune is not None:
                    responses = [*responses, tune]
            self._observer.negotiated(lists, responses)
        except WireError as exc:
            log.error("%s", exc)
            return self.coordinator.abort(f"unison stopped the job: {exc}")
        except Exception as exc:  # noqa: BLE001 - reaches every rank as the abort's reason
            log.exception("the coordinator failed")
            return self.coordinator.abort(
                f"unison stopped the job: its coordinator on rank 0 failed: {type(exc).__name__}: {exc}"
            )
        return responses

    def _announce_stop(self, text: str) -> None:
        """Rank 0: broadcast `text` as a job stop (a STALL response) in the next slow-path cycle."""
        self._news = text

    def _apply_tuning(self, proposal: Proposal) -> None:
        """Switch to the autotuner's parameters; every rank calls this at the end of the same cycle.

        Fusion plans are made from the same responses with the same threshold on every rank, so they
        stay equal. Turning the cache off erases every slot on every rank (the caches stay equal,
        empty) and sends pending hits back through negotiation; the chunk size only changes how the
        data plane splits a buffer.
        """
        old = self.autotuning.apply(proposal)
        new = proposal.parameters
        self.policy = dataclasses.replace(self.policy, threshold_bytes=new.fusion_threshold_bytes)
        if new.chunk_bytes != old.chunk_bytes:
            self.executor.set_chunk_bytes(new.chunk_bytes)
        if old.cache_enabled and not new.cache_enabled:
            self.cache.erase(self.cache.slots())
            self._work.revalidate()

    # -- execution ----------------------------------------------------------------------------------

    def _execute_all(self, responses: list[Response], measuring: bool) -> tuple[int, int]:
        """Run the cycle's responses, fused; return (responses run, bytes reduced here), or (-1, 0)
        when the job stops."""
        executed = 0
        reduced_bytes = 0
        for response in plan_fusion(responses, self.policy) if len(responses) > 1 else responses:
            executed += 1
            if self.on_response is not None:
                self.on_response(response)
            if measuring and response.kind in _REDUCING and \
                    self.rank in self.process_sets.get(response.process_set_id, ()):
                reduced_bytes += response.num_bytes()
            if not self._execute(response):
                return -1, 0
        return executed, reduced_bytes

    def _take(self, name: str) -> Entry | None:
        entry = self._work.take(name)
        if entry is not None:
            self._queue.release(name)
        return entry

    def _execute(self, response: Response) -> bool:
        """Run one response as `unison.protocol.dispatch` routes it; return False when the job stops."""
        self._stats["responses"] += 1
        action, members_only = self._dispatch[response.kind._value_]
        if members_only and self.rank not in self.process_sets.get(response.process_set_id, ()):
            return True
        return action(response)

    def _stop_shutdown(self, response: Response) -> bool:
        ranks = list(response.ranks)
        self._stop(ShutdownError(
            f"unison has been shut down: rank(s) {ranks} called shutdown() (or exited) while this "
            "rank still had collectives pending. A rank that finishes early, or fails, stops the job "
            "for everyone: check that every rank runs the same collectives, and look in the log of "
            f"rank(s) {ranks} for an exception."
        ))
        return False

    def _stop_stall(self, response: Response) -> bool:
        self._stop(StallError(response.message))  # rank 0 logged the report; the error carries it
        return False

    def _stop_abort(self, response: Response) -> bool:
        log.error("%s", response.message)
        self._stop(AbortedError(response.message))
        return False

    def _fail(self, response: Response) -> bool:
        self._stats["errors"] += 1
        for name in response.names:
            entry = self._take(name)
            if entry is not None:
                entry.handle.fail(MismatchError(response.message))
        return True

    def _end_join(self, response: Response) -> bool:
        entry = self._take("join.noname")
        self._work.joined = False
        if entry is not None:
            entry.handle.complete(response.last_joined)
        return True

    def _add_process_set(self, response: Response) -> bool:
        self.backend.add_process_set(response.process_set_id, response.ranks)
        self.process_sets[response.process_set_id] = tuple(response.ranks)
        self.cache.version += 1
        entry = self._take(response.names[0])
        if entry is not None:
            entry.handle.complete(response.process_set_id)
        return True

    def _remove_process_set(self, response: Response) -> bool:
        self.backend.remove_process_set(response.process_set_id)
        self.process_sets.pop(response.process_set_id, None)
        entry = self._take(response.names[0])
        if entry is not None:
            entry.handle.complete(True)
        return True

    def _barrier(self, response: Response) -> bool:
        for entry in [self._take(name) for name in response.names]:
            if entry is not None:
                entry.handle.complete(None)
        return True

    def _run_collective(self, response: Response) -> bool:
        entries = [self._take(name) for name in response.names]
        observer = self._observer
        observer.executing(response)
        try:
            results = self.executor.run(response, entries)
        except Exception as exc:  # noqa: BLE001 - turned into an error on every waiting handle
            log.exception("%s failed", response.kind)
            for entry in entries:
                if entry is not None:
                    entry.handle.fail(HorovodInternalError(
                        f"{response.kind} of {list(response.names)} failed: {exc}"))
            return True
        finally:
            observer.executed(response)
        for entry, result in zip(entries, results):
            if entry is not None:
                entry.handle.complete(result)
        return True

    def _ignore(self, response: Response) -> bool:
        return True  # TUNE: applied at the end of the cycle (`split_tuning` takes it out first)

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
        waiting = self._work.clear() + queued
        for entry in waiting:
            entry.handle.fail(type(error)(str(error)))
        if first:
            self._stopped.set()
            if self.on_stop is not None:
                try:
                    self.on_stop(error, bool(waiting))
                except Exception:  # noqa: BLE001 - a failing hook must not keep the engine alive
                    log.exception("stop hook failed")

    # -- rank 0 only: the timeline ------------------------------------------------------------------

    def set_timeline(self, timeline: Timeline | None) -> None:
        """Start (or with None, stop) writing the timeline; rank 0 only."""
        old, self.timeline = self.timeline, timeline
        self._observer = observe_all(self._stall_feed, timeline)
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
