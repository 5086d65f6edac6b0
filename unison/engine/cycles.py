"""What a cycle does on this rank: exchange, decide, act (the engine runs one at a time, on any thread).

`Cycles.run` is one whole cycle (`unison.engine` tells it step by step): take what was queued, admit it
against the response cache, exchange status (`unison.engine.status`), run the slow path where some rank
has uncached requests (`unison.engine.slow_path`), execute the responses in the same order as every
rank (`unison.engine.actions`), update the cache, apply the autotuner's parameters. `Cycles.solo` is the
steady state's cycle: this rank's only work is one allreduce whose response is cached; the same
summary goes out and the same decision comes back as in `run`, with the general bookkeeping skipped
when the summary says that slot alone runs. The engine (`unison.engine.loop`) owns the threads and the
lifecycle and decides which thread runs a cycle.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from ..backends.base import Backend
from ..errors import HorovodInternalError
from ..ops import Kind
from ..protocol.autotune import Proposal
from ..protocol.cache import CacheState, ResponseCache
from ..protocol.cycle import FLAG_NEWS, FLAG_PAYLOAD, Summary, bits, read_votes, solo_runs, words_for
from ..protocol.fusion import FusionPolicy, plan_fusion
from ..protocol.messages import Request, Response, encode_requests
from ..protocol.negotiation import Coordinator
from ..protocol.places import Place, encode_place
from . import where
from .actions import Actions
from .autotuning import Autotuning
from .executor import Executor
from .flight import DONE, FAILED, FlightRecord
from .handles import Entry, Handle, main_wait_number
from .observer import SILENT, CycleObserver
from .pending import PendingWork
from .queue import Drained, SubmissionQueue
from .slow_path import SlowPath
from .stall_feed import StallFeed
from .status import StatusExchange

__all__ = ["Cycles"]

_CACHEABLE = Kind.ALLREDUCE
_SLOW = FLAG_PAYLOAD | FLAG_NEWS
_REDUCING = (Kind.ALLREDUCE, Kind.REDUCESCATTER)  # what autotune scores


class Cycles:
    """This rank's cycles over the engine's parts (call under the engine's cycle lock only).

    Args:
        backend: the transport.
        rank: this rank.
        process_sets: set id -> members, the engine's own dict.
        cache: the response cache, identical on every rank.
        executor: runs collectives.
        queue: what framework threads submitted.
        coordinator: rank 0's coordinator, None elsewhere.
        stall_feed: rank 0's stall feed, None elsewhere or with the stall check off.
        autotuning: the autotuner's run-time side.
        policy: the fusion policy (the autotuner changes its threshold).
        stop: stops the engine with an error (a stop response).
        stats: the engine's counters, updated here.

    Attributes:
        work: this rank's pending work.
        status: the status exchange.
        slow: the slow path (rank 0's news lives there).
        observer: what watches each cycle (rank 0's stall feed and timeline); the engine replaces it.
        on_response: called with each response just before it runs (tools and tests).
        started: when the latest cycle started (`time.monotonic`).
        progress: the latest cycle took or ran something.
        detail: rank 0's stall feed asked for every rank's row in the next cycle.
        flight: this rank's last collectives (`unison.engine.flight`).
    """

    def __init__(self, backend: Backend, rank: int, process_sets: dict[int, tuple[int, ...]],
                 cache: ResponseCache, executor: Executor, queue: SubmissionQueue,
                 coordinator: Coordinator | None, stall_feed: StallFeed | None, autotuning: Autotuning,
                 policy: FusionPolicy, stop: Callable[[BaseException], None], stats: dict[str, int]) -> None:
        self.rank, self.process_sets, self.cache, self.executor = rank, process_sets, cache, executor
        self.queue, self.stall_feed, self.autotuning, self.policy = queue, stall_feed, autotuning, policy
        self._stats = stats
        # Steady calls that ran alone (`steady`): each is a cycle, a fast and a driven one, a cache hit
        # executed and a response, counted once here and added to those counters when they are read
        # (`Engine.statistics`): eight counters less to bump on the steady state's every call.
        self.steady_calls = 0
        self.work = PendingWork(rank, cache, process_sets)
        self.status = StatusExchange(backend)
        self.status.where_of = self._place_row  # sent in detail cycles only
        if stall_feed is not None:
            stall_feed.places_of = self.status.take_places
        self.flight = FlightRecord()
        self.observer: CycleObserver = SILENT  # rank 0's timeline, while it writes one (`Engine.set_timeline`)
        self.slow = SlowPath(backend, coordinator, autotuning, lambda: self.observer)
        self.actions = Actions(rank, process_sets, backend, cache, executor, self.work, queue.release, stop,
                               lambda: self.observer, stats)
        self.on_response: Callable[[Response], None] | None = None
        self.started = 0.0
        self.progress = False
        self.detail = False

    def __repr__(self) -> str:
        return f"<Cycles rank={self.rank} pending={len(self.work.entries)} {self.status!r}>"

    def solo_ready(self) -> bool:
        """Whether a cycle now could be the steady state's (`solo`), given one cached allreduce."""
        work = self.work
        return (not (work.entries or work.joined or self.slow.news or self.detail or not self.status.reduces
                     or self.cache.capacity <= 0) and self.autotuning.quiet())  # quiet: `cache_on`'s setting

    def cache_on(self) -> bool:
        """Whether the response cache is in use (a setting, and the autotuner may turn it off)."""
        return self.cache.capacity > 0 and self.autotuning.parameters.cache_enabled

    def has_work(self) -> bool:
        """Whether a cycle now has something to send or run (else it would be an idle cycle)."""
        return bool(self.queue.has_work() or self.slow.news or self.work.unsent or self.work.entries
                    or self.autotuning.due)

    def run(self, drained: Drained | None = None) -> None:
        """One cycle of the job: exchange, decide, act (`drained`: what a waiting thread already took
        from the queue, `driven`)."""
        self._stats["cycles"] += 1
        now = self.started = time.monotonic()
        self.observer.cycle_started(now)
        if drained is None:
            drained = self.queue.take()
        if drained.groups:
            submitted = self.flight.submitted
            for group in drained.groups:
                for entry in group:
                    submitted(entry.request, now)
        self.work.admit(drained.groups, self.cache_on())

        # 1. Exchange status: a summary of votes and flags, and every rank's row when it is needed.
        payload, words, summary, matrix = self._exchange_status(drained)
        self._decide_and_act(now, bool(drained.groups), payload, words, summary, matrix)

    def driven(self) -> None:
        """The cycle a waiting thread runs (`Engine.drive`): when its one cached allreduce is all this rank
        has to do, the steady state's cycle (`solo`); otherwise a whole one."""
        drained = self.queue.take()
        groups = drained.groups
        if (len(groups) == 1 and len(groups[0]) == 1 and not drained.shutdown and not drained.abort_reason
                and self.solo_ready()):
            entry = groups[0][0]
            request = entry.request
            if request.kind is _CACHEABLE and request.device == "cpu":
                state, slot = self.cache.lookup(request, count=False)
                if state is CacheState.HIT:
                    self.cache.count_hit()  # as the whole cycle's admission would
                    self.solo(entry, slot, drained.blocked)
                    return
        self.run(drained)

    def solo(self, entry: Entry, slot: int, blocked: bool) -> None:
        """The steady state's cycle: this rank's only work is one allreduce whose response is cached.

        The same cycle as `run` (the same summary goes out, the same decision comes back), with the
        general bookkeeping skipped when the summary says that this slot alone runs, which is what
        every rank sees when every rank submitted the same call: then it runs here at once.
        """
        self._stats["cycles"] += 1
        now = self.started = time.monotonic()
        self.observer.cycle_started(now)
        work = self.work
        entry.slot = slot
        work.entries[entry.request.name] = entry
        work.invalid = 0
        foreign, words = work.solo_votes()
        summary = self.status.reduce_solo(slot, foreign, blocked, words)
        if solo_runs(summary, slot):
            if self.stall_feed is not None and self.stall_feed.due(now):
                self.detail = self.stall_feed.voted(now, summary, None, None)
            self._stats["fast_cycles"] += 1
            self._stats["cache_hits_executed"] += 1
            response = self.cache.get(slot)
            if self.on_response is not None:
                self.on_response(response)
            self.actions.run_one(response)  # an allreduce of a set this rank is in: it submitted it
            self.flight.append((entry.request, now, now, FAILED if entry.handle.error else DONE))
            self.progress = True
            return
        self.flight.submitted(entry.request, now)
        matrix = None
        if summary.needs_rows:  # rows for rank 0: the slow path's lengths, the stall feed's detail
            matrix = self.status.rows(joined=False, news=False, blocked=blocked, payload_bytes=0,
                                      hits=(1 << slot) | foreign, invalid=0, words=words)
        self._decide_and_act(now, True, b"", words, summary, matrix)

    def steady(self, request: Request, source: np.ndarray, output: np.ndarray, slot: int, blocked: bool,
               driver: Callable[[Handle, float | None], None]) -> Entry | None:
        """`solo` for a blocking call that made no entry yet (`Engine.run_steady`): None once its result is
        in `output`; else, the summary having asked for more than this slot, the entry it became, which
        waits for a later cycle like any other."""
        now = self.started = time.monotonic()
        observer = self.observer
        watched = observer is not SILENT  # nothing watches most ranks: no calls to say so
        if watched:
            observer.cycle_started(now)
        work = self.work
        work.invalid = 0
        foreign, words = work.solo_votes()
        summary = self.status.reduce_solo(slot, foreign, blocked, words)
        entry = None
        if solo_runs(summary, slot):
            if self.stall_feed is not None and self.stall_feed.due(now):
                self.detail = self.stall_feed.voted(now, summary, None, None)
            self.steady_calls += 1
            response = self.cache.get(slot)
            if self.on_response is not None:
                self.on_response(response)
            if watched:
                observer.executing(response)
            try:
                self.executor.run_single(response, source, output)
            except Exception as exc:  # noqa: BLE001 - the caller's error, as a failed entry's would be
                entry = Entry(request, source, output, Handle(request.name, driver))
                failure = HorovodInternalError(f"{response.kind} of {list(response.names)} failed: {exc}")
                failure.__cause__ = exc
                entry.handle.fail(failure)
            finally:
                if watched:
                    observer.executed(response)
            self.flight.append((request, now, now, DONE if entry is None else FAILED))
            self.queue.release(request.name)
            self.progress = True
            return entry
        stats = self._stats
        stats["cycles"] += 1
        stats["driven_cycles"] += 1
        self.cache.count_hit()  # as a cycle's admission counts it
        self.flight.submitted(request, now)
        entry = Entry(request, source, output, Handle(request.name, driver))
        entry.slot = slot
        work.entries[request.name] = entry
        matrix = None
        if summary.needs_rows:
            matrix = self.status.rows(joined=False, news=False, blocked=blocked, payload_bytes=0,
                                      hits=(1 << slot) | foreign, invalid=0, words=words)
        self._decide_and_act(now, True, b"", words, summary, matrix)
        return entry

    def _decide_and_act(self, now: float, progress: bool, payload: bytes, words: int, summary: Summary,
                        matrix: list[list[int]] | None) -> None:
        """Steps 2 to 5 of a cycle, once its status is exchanged (`unison.engine`)."""

        # 2. Decide, from the exchange alone: the fast path runs the slots every rank voted for without
        # asking the coordinator; the slow path runs only when some rank has requests the cache
        # could not answer. The summary decides; rows, where gathered, also feed the stall inspector.
        cached: list[Response] = [self.cache.get(slot) for slot in summary.runnable()]
        if cached:
            self._stats["cache_hits_executed"] += len(cached)
        if self.stall_feed is not None:
            votes = None if matrix is None else read_votes(matrix, words)
            self.detail = self.stall_feed.voted(now, summary, votes, matrix)
        fresh: list[Response] = []
        tuning: Proposal | None = None
        if summary.flags & _SLOW:  # some rank has uncached requests, or rank 0 has news
            self._stats["slow_cycles"] += 1
            fresh, tuning = self.slow.run(payload, [] if matrix is None else [row[1] for row in matrix], now)
        else:
            self._stats["fast_cycles"] += 1

        # 3. Act: execute, in the same order on every rank.
        measuring = self.autotuning.measuring
        executed, reduced_bytes = self._execute_all(cached + fresh, measuring)
        if executed < 0:
            return
        self.progress = progress or executed > 0

        # 4. Update the cache identically everywhere. Only now: an erase or eviction must not send
        # back to negotiation a tensor that ran from the cache in this very cycle.
        if summary.invalid:
            self.cache.erase(bits(summary.invalid))
        cacheable = [r for r in fresh if r.kind is _CACHEABLE and len(r.names) == 1]
        if self.cache_on():
            for response in cacheable:
                self.cache.put(response)
        if summary.invalid or cacheable:
            self.work.revalidate()

        # 5. Autotune: apply a new parameter set at this same point on every rank; rank 0 measures.
        if tuning is not None:
            self._apply_tuning(tuning)
        if measuring:
            self.autotuning.measure(reduced_bytes, now, restart=tuning is not None)

    def _exchange_status(self, drained: Drained) -> tuple[bytes, int, Summary, list[list[int]] | None]:
        """Exchange this rank's status: return (payload, words, summary, every rank's rows or None)."""
        requests = self.work.take_unsent()
        if drained.abort_reason:
            requests.append(Request("shutdown", Kind.SHUTDOWN, self.rank, reason=drained.abort_reason))
        elif drained.shutdown:
            requests.append(Request("shutdown", Kind.SHUTDOWN, self.rank))
        payload = encode_requests(requests) if requests else b""
        words = words_for(self.cache.num_slots)
        work = self.work
        # A parameter change of the autotuner is news too: it travels with this cycle's responses.
        news = bool(self.slow.news) or self.autotuning.due
        summary, matrix = self.status.exchange(
            joined=work.joined, news=news, blocked=drained.blocked, detail=self.detail,
            payload_bytes=len(payload), hits=work.hits(), own=work.own_hits(), invalid=work.invalid,
            words=words)
        self.detail = False
        return payload, words, summary, matrix

    def _place_row(self) -> bytes:
        """This rank's place row for a detail cycle (`unison.protocol.places`): where its main thread is,
        the collective it waits for there and that collective's site. Never raises: a cycle must not
        fail over a report."""
        try:
            at, waits, request, stack = where.main_thread()
            site = ""
            if isinstance(request, Request):  # the steady state's call, run on the main thread itself
                waits, site = request.name, request.site
            elif waits:
                entry = self.work.entries.get(waits)
                site = entry.request.site if entry is not None else ""
            return encode_place(Place(at, waits, site, tuple(stack), main_wait_number()))
        except Exception:  # noqa: BLE001 - the report goes without this rank's place
            return encode_place(Place(""))

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
            self.work.revalidate()

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
            if not self.actions.execute(response):
                return -1, 0
            self.flight.finished(response, time.monotonic(), response.kind is Kind.ERROR)
        return executed, reduced_bytes
