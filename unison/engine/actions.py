"""What a response does on this rank when its cycle runs it: one method per `unison.protocol.dispatch.Action`.

The loop (`unison.engine.loop`) decides which responses run and in what order; `Actions.execute` runs
one, as the dispatch table routes its kind: a collective goes to the executor, an error fails the
named tensors, a join ends, a process set is added or removed, a barrier completes, and the three stops
end the job through the engine's `stop`. Only the thread running the cycle calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backends.base import Abandoned, Backend
from ..errors import AbortedError, HorovodInternalError, MismatchError, ShutdownError, StallError
from ..protocol.cache import ResponseCache
from ..protocol.dispatch import ROUTES, Action
from ..protocol.messages import Response
from .executor import Executor
from .handles import Entry
from .observer import CycleObserver

if TYPE_CHECKING:
    from .pending import PendingWork

__all__ = ["Actions"]

log = logging.getLogger(__name__)


class Actions:
    """This rank's response actions over the engine's parts.

    Args:
        rank: this rank.
        process_sets: set id -> members, the engine's own dict (changed here as sets come and go).
        backend: the transport (its process-set communicators).
        cache: the response cache (its version marks a set change).
        executor: runs collectives.
        work: this rank's pending work (entries are taken from it as their responses run).
        release: forget a name in flight on this rank (`SubmissionQueue.release`).
        stop: stop the engine with an error.
        observer: the engine's current cycle observer (it changes with the timeline).
        stats: the engine's counters (``responses``, ``errors``).
    """

    def __init__(self, rank: int, process_sets: dict[int, tuple[int, ...]], backend: Backend,
                 cache: ResponseCache, executor: Executor, work: PendingWork, release: Callable[[str], None],
                 stop: Callable[[BaseException], None], observer: Callable[[], CycleObserver],
                 stats: dict[str, int]) -> None:
        self.rank, self.process_sets, self.backend, self.cache = rank, process_sets, backend, cache
        self.executor, self.work, self._release, self._stop = executor, work, release, stop
        self._observer, self._stats = observer, stats
        methods: dict[Action, Callable[[Response], bool]] = {
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
            kind.value: (methods[route.action], route.members_only) for kind, route in ROUTES.items()
        }

    def __repr__(self) -> str:
        return f"<Actions rank={self.rank} sets={sorted(self.process_sets)}>"

    def execute(self, response: Response) -> bool:
        """Run one response as `unison.protocol.dispatch` routes it; return False when the job stops."""
        self._stats["responses"] += 1
        action, members_only = self._dispatch[response.kind._value_]
        if members_only and self.rank not in self.process_sets.get(response.process_set_id, ()):
            return True
        return action(response)

    def run_one(self, response: Response) -> None:
        """Run a one-tensor collective this rank submitted (`execute` without the routing)."""
        self._stats["responses"] += 1
        self._run_collective(response)

    def take(self, name: str) -> Entry | None:
        """This rank's entry for `name`, out of the pending work and out of flight (None if it has none)."""
        entry = self.work.take(name)
        if entry is not None:
            self._release(name)
        return entry

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
        # Every rank gets the abort; the failing rank and the launcher report it (unison._job.stop_report).
        log.debug("%s", response.message)
        self._stop(AbortedError(response.message))
        return False

    def _fail(self, response: Response) -> bool:
        self._stats["errors"] += 1
        for name in response.names:
            entry = self.take(name)
            if entry is not None:
                entry.handle.fail(MismatchError(response.message))
        return True

    def _end_join(self, response: Response) -> bool:
        entry = self.take("join.noname")
        self.work.joined = False
        if entry is not None:
            entry.handle.complete(response.last_joined)
        return True

    def _add_process_set(self, response: Response) -> bool:
        self.backend.add_process_set(response.process_set_id, response.ranks)
        self.process_sets[response.process_set_id] = tuple(response.ranks)
        self.cache.version += 1
        entry = self.take(response.names[0])
        if entry is not None:
            entry.handle.complete(response.process_set_id)
        return True

    def _remove_process_set(self, response: Response) -> bool:
        self.backend.remove_process_set(response.process_set_id)
        self.process_sets.pop(response.process_set_id, None)
        self.cache.version += 1  # the foreign slots change with the sets (`PendingWork.solo_votes`)
        entry = self.take(response.names[0])
        if entry is not None:
            entry.handle.complete(True)
        return True

    def _barrier(self, response: Response) -> bool:
        for entry in [self.take(name) for name in response.names]:
            if entry is not None:
                entry.handle.complete(None)
        return True

    def _run_collective(self, response: Response) -> bool:
        names = response.names
        entries = [self.take(names[0])] if len(names) == 1 else [self.take(name) for name in names]
        observer = self._observer()
        observer.executing(response)
        try:
            results = self.executor.run(response, entries)
        except Exception as exc:  # noqa: BLE001 - turned into an error on every waiting handle
            if isinstance(exc, Abandoned):  # this process gave the job up (an elastic epoch's end, a stop)
                log.debug("%s of %s abandoned", response.kind, list(names))
            else:
                log.exception("%s failed", response.kind)
            failure = HorovodInternalError(f"{response.kind} of {list(response.names)} failed: {exc}")
            failure.__cause__ = exc  # raised in each waiting thread with it (`unison._job.calls`)
            for entry in entries:
                if entry is not None:
                    entry.handle.fail(failure)
            return True
        finally:
            observer.executed(response)
        for entry, result in zip(entries, results):
            if entry is not None:
                entry.handle.complete(result)
        return True

    def _ignore(self, response: Response) -> bool:
        return True  # TUNE: applied at the end of the cycle (`split_tuning` takes it out first)
