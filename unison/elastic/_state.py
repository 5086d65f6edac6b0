"""Horovod's elastic State classes and the ``run`` wrapper.

Horovod resets a job in place (shutdown, init, restore). Under unisonrun's elastic driver the workers
do the same: each keeps its process across membership epochs (`_reform`: the job re-forms on gloo
groups made from the driver's store), and at the start of every epoch ``run`` restores the newest
commit any host kept in shared memory (new workers receive it from a survivor), then runs the reset
callbacks. Where the driver relaunches every process instead (one MPI launch per epoch), ``run``
restores when the launch begins, ends the process with status `HOSTS_UPDATED_EXIT` when ``commit()``
finds that the hosts changed, and lets a failure end the launch.

Example:
    >>> state = hvd.elastic.TorchState(model, optimizer, epoch=0)          # doctest: +SKIP
    >>> @hvd.elastic.run
    ... def train(state):
    ...     for state.epoch in range(state.epoch, 10):
    ...         step(); state.commit()                                     # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from ..errors import ConfigError, HorovodInternalError, HostsUpdatedInterrupt
from . import _codec, _reform
from ._environment import HOSTS_UPDATED_EXIT, ask_driver, environment
from .store import CommitId, StateStore

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "SnapshotState", "State", "run", "run_fn"]

log = logging.getLogger("unison")

_ASK_EVERY_SECONDS = 0.1  # rank 0 asks the driver at most this often; commits in between reuse the answer
_ASK_AFTER_NO_ANSWER_SECONDS = 5.0  # after a question the driver did not answer, wait longer
_HOST_COMMIT_WAIT_SECONDS = 5.0
_UPDATES_NAME = "unison.elastic.host_updates"
# The State whose host check is in flight in this process: the broadcast's one name is used by one
# collective at a time, so a State starting its check first finishes another's (two States committing).
_checking: list[State] = []
# Where a State keeps its own bookkeeping in its __dict__: not an identifier, so no state value can
# name it (values are attributes, and their names must be identifiers).
_BOOKS = "unison elastic bookkeeping"

_Result = TypeVar("_Result")


@dataclasses.dataclass
class _Books:
    """A State's own bookkeeping, kept apart from the values the user puts in it (``epoch``, ``commits``, ...).

    Horovod's State keeps its values as attributes, so any name a user chooses is an attribute; a
    script that keeps a counter named ``commits`` (Horovod's own elastic scripts do) must not touch
    unison's commit number, nor a value named ``_saved`` the last save.
    """

    bcast_object: Callable[..., object]  # kept for Horovod's interface; the launch's broadcast replaces it
    get_rank: Callable[[], int]
    names: list[str] = dataclasses.field(default_factory=list)  # the user's values, in order
    reset_callbacks: list[Callable[[], object]] = dataclasses.field(default_factory=list)
    commits: int = 0  # commits since the job began (carried across launches)
    known_updates: int = 0
    driver_updates: int = 0
    asked_at: float = float("-inf")
    pending_check: tuple[int, np.ndarray] | None = None  # the broadcast the next check reads
    checked: int | None = None  # its value, when another State's check finished it first
    saved: Any = None  # what the State's _capture returned, of its subclass's own shape
    saved_in_store: bool = False
    background_commits: bool = False  # TorchState: tensors change only in optimizer.step()
    writer: threading.Thread | None = None
    write_error: BaseException | None = None
    writer_store: StateStore | None = None

    def new_epoch(self) -> None:
        """Forget what belonged to the epoch that ended: its host check and the driver's count of changes."""
        self.known_updates = self.driver_updates = 0
        self.asked_at = float("-inf")
        self.pending_check = self.checked = None


class State:
    """What an elastic job keeps across resets: subclasses say how to save, restore and sync it.

    Horovod's interface: ``commit()`` saves and checks for host changes; ``restore()`` returns to the
    last save; ``sync()`` makes every rank hold rank 0's values; ``register_reset_callbacks`` names
    functions called after each reset (in unison: at the start of every launch after the first).
    The values a subclass keeps are attributes named as the user chose; unison's own bookkeeping
    (the commit number among it) lives apart from them, so a value of any name is only a value.
    """

    def __init__(self, bcast_object: Callable[..., object], get_rank: Callable[[], int]) -> None:
        vars(self)[_BOOKS] = _Books(bcast_object, get_rank)

    @property
    def _books(self) -> _Books:
        books: _Books = vars(self)[_BOOKS]
        return books

    def _set_values(self, values: dict[str, object]) -> None:
        """Keep `values` as attributes (the user's names), after checking that no name hides the State's own."""
        for name in values:
            if not name.isidentifier():
                raise ValueError(f"A state value's name must be an identifier (values are attributes). "
                                 f"Got {name!r}. Rename it.")
            if hasattr(type(self), name) or name in vars(self):
                raise ValueError(
                    f"A state value named {name!r} would hide {type(self).__name__}.{name}, which the state "
                    f"needs. Rename the value (for example {name.strip('_')}_value=...).")
        self._books.names = list(values)
        for name, value in values.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(commits={self._books.commits}, epoch={environment().epoch})"

    def statistics(self) -> dict[str, int]:
        """unison's counters: commits since the job began, host changes seen (not the user's values)."""
        return {"commits": self._books.commits, "host_updates": self._books.known_updates}

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Call each of `callbacks` after every reset, in order (e.g. to scale the learning rate)."""
        self._books.reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run `reset` and the registered callbacks."""
        self.reset()
        for callback in self._books.reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: object = None, update_res: object = None) -> None:
        """Horovod's listener hook; unison's rank 0 asks the driver instead, so it does nothing."""

    @property
    def _host_messages(self) -> _HostMessages:
        """Horovod's queue of the driver's host messages, as its elastic test scripts read it: ``empty()``
        is False once the driver announced a change of hosts to this epoch (rank 0 asks the driver)."""
        return _HostMessages(self)

    def commit(self) -> None:
        """Save the state (into this host's shared memory under the elastic driver), then check hosts.

        Raises:
            HostsUpdatedInterrupt: on every rank at once, after saving, when the hosts changed.
        """
        self._books.commits += 1
        self._commit_state()
        self.check_host_updates()

    def _commit_state(self) -> None:
        self.save()

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank when the driver announced a host change.

        Rank 0 asks the driver (at most every 0.1 s) and broadcasts its answer without waiting for
        it; every rank reads that broadcast at its next check. The training step in between hides the
        broadcast's latency, every rank still raises at the same call, and a change is acted on one
        check after rank 0 learned of it.
        """
        if not environment().driver:
            return
        seen = self._finish_check()
        if seen > self._books.known_updates:
            self._books.known_updates = seen
            raise HostsUpdatedInterrupt(False)
        self._start_check()

    def _ask_driver(self) -> None:
        """On rank 0, at most every 0.1 s: ask the driver how many host changes it announced to this epoch."""
        env = environment()
        books = self._books
        if books.get_rank() == 0:
            now = time.monotonic()
            if now - books.asked_at >= _ASK_EVERY_SECONDS:
                books.asked_at = now
                answer = ask_driver(env.driver, env.epoch)
                if answer is None:  # no answer (up to 2 s lost): ask again only after a while
                    books.asked_at = now + _ASK_AFTER_NO_ANSWER_SECONDS
                else:
                    books.driver_updates = answer

    def _start_check(self) -> None:
        """Start broadcasting rank 0's count of announced host changes, read by the next check."""
        from .._job.collectives import broadcast_async_

        books = self._books
        self._ask_driver()
        count = np.array([books.driver_updates], dtype=np.int64)
        for other in list(_checking):
            other._resolve_check()
        books.pending_check = (broadcast_async_(count, 0, name=_UPDATES_NAME), count)
        _checking[:] = [self]

    def _take_check(self) -> tuple[int, np.ndarray] | None:
        """This State's check broadcast (handle, buffer), if one runs; no longer in flight for the others."""
        if _checking and _checking[0] is self:
            _checking.clear()
        pending, self._books.pending_check = self._books.pending_check, None
        return pending

    def _resolve_check(self) -> None:
        """Wait for this State's check broadcast, if one runs, and keep its value for the next check."""
        from .._job.submit import synchronize

        pending = self._take_check()
        if pending is not None:
            synchronize(pending[0])
            self._books.checked = int(pending[1][0])

    def _drop_check(self, timeout_seconds: float) -> None:
        """At shutdown: let the check broadcast in flight finish (every rank started it), but wait at
        most `timeout_seconds` and never raise: the job is ending either way."""
        from .._job.submit import release

        pending = self._take_check()
        if pending is not None:
            try:
                release(pending[0], timeout_seconds)
            except Exception:  # noqa: BLE001  (the job already stopped: nothing left to wait for)
                pass

    def _finish_check(self) -> int:
        """Rank 0's count from the previous check (this rank's known count when there was none)."""
        self._resolve_check()
        seen, self._books.checked = self._books.checked, None
        return self._books.known_updates if seen is None else seen

    def _settle(self) -> None:
        """Finish what the last commit left running (the host check's broadcast), on every rank at the end of `run`."""
        self._finish_check()

    def _abandon(self) -> None:
        """After a failed collective: forget the check in flight (its job is gone) without waiting for it."""
        self._take_check()
        _checking.clear()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Hook run after a reset, before the callbacks."""


def _rank() -> int:
    from .._job.runtime import rank

    return rank()


def _broadcast_bytes(data: bytearray | None, root_rank: int) -> memoryview:
    """`root_rank`'s `data` on every rank (two broadcasts: the length, then the bytes)."""
    from .._job.collectives import broadcast_

    length = np.array([len(data) if data is not None else 0], dtype=np.int64)
    broadcast_(length, root_rank, name="unison.elastic.state_bytes_length")
    buffer = (np.frombuffer(data, dtype=np.uint8) if data is not None
              else np.empty(int(length[0]), dtype=np.uint8))
    if buffer.size:
        broadcast_(buffer, root_rank, name="unison.elastic.state_bytes")
    return memoryview(buffer.data)


class SnapshotState(State):
    """A State that can list its values (`_capture`) and take them back (`_apply`).

    Under the elastic driver a commit on the first rank of each host writes the encoded values into
    the host's shared memory (one copy, from the live values) and the host's other ranks copy nothing:
    their `restore` reads the host's commit. Without the driver every rank keeps a copy in memory.
    """

    # Any: each subclass captures values of its own shape (a dict of attributes, tensors' state)
    def _capture(self) -> Any:
        raise NotImplementedError

    def _apply(self, values: Any) -> None:
        raise NotImplementedError

    def _store(self) -> StateStore | None:
        """This host's store when this rank writes it (kept, so that its mappings last between commits)."""
        env = environment()
        rank = self._books.get_rank()
        if not env.writes_store(rank):
            return None
        books = self._books
        host = env.host_of(rank)
        if books.writer_store is not None and books.writer_store.path != StateStore(env.store, host).path:
            books.writer_store.close()  # this worker now writes another host's store (a new epoch)
            books.writer_store = None
        if books.writer_store is None:  # kept while the epoch keeps this rank on this host
            books.writer_store = StateStore(env.store, host)
        return books.writer_store

    def save(self) -> None:
        """Keep a copy of the current values for `restore`."""
        self._books.saved = copy.deepcopy(self._capture())
        self._books.saved_in_store = False

    def _commit_state(self) -> None:
        env = environment()
        if not env.store:
            self.save()
            return
        # Under the driver only the host's first rank copies anything: the others restore from it.
        books = self._books
        store = self._store()
        if store is not None:
            self.finish_commit()
            parts = _codec.encode(self._capture())
            commit = CommitId(epoch=env.epoch, commit=books.commits)
            if books.background_commits:
                books.writer = threading.Thread(target=self._write, args=(store, commit, parts),
                                                name="unison-elastic-commit", daemon=True)
                books.writer.start()
            else:
                store.write(commit, parts)
        books.saved, books.saved_in_store = None, True

    def _write(self, store: StateStore, commit: CommitId, parts: list[memoryview]) -> None:
        try:
            store.write(commit, parts)
        except BaseException as exc:  # noqa: BLE001  (re-raised by finish_commit on the caller's thread)
            self._books.write_error = exc

    def _settle(self) -> None:
        """Finish the last commit's write and host check (every rank, at the end of `run`)."""
        super()._settle()
        self.finish_commit()

    def _abandon(self) -> None:
        """After a failed collective: forget the check in flight; let the last commit's write end (the
        restore that follows reads the newest complete commit of any host, whether or not it did)."""
        super()._abandon()
        books = self._books
        writer, books.writer = books.writer, None
        if writer is not None:
            writer.join()
        books.write_error = None

    def finish_commit(self) -> None:
        """Wait until the last commit is in shared memory (a no-op unless commits are written in the background)."""
        books = self._books
        writer, books.writer = books.writer, None
        if writer is not None:
            writer.join()
        error, books.write_error = books.write_error, None
        if error is not None:
            raise error

    def _host_commit(self) -> tuple[CommitId, bytearray]:
        """This host's commit of this rank's commit number (waiting briefly for the host's writer)."""
        env = environment()
        store = StateStore(env.store, env.host_of(self._books.get_rank()))
        deadline = time.monotonic() + _HOST_COMMIT_WAIT_SECONDS
        while True:
            found = store.read()
            if found is not None and found[0].commit >= self._books.commits or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if found is None or found[0].commit != self._books.commits:
            raise HorovodInternalError(
                f"restore() found commit {found[0].commit if found else None} in {store!r}, not this rank's "
                f"commit {self._books.commits}: the host's first rank is not at the same commit. Call restore() "
                "on every rank at the same point of the training loop.")
        return found

    def restore(self) -> None:
        """Return to the values of the last commit (or save)."""
        if self._books.saved_in_store:
            self.finish_commit()
            self._apply(_codec.decode(self._host_commit()[1]))
        elif self._books.saved is not None:
            self._apply(copy.deepcopy(self._books.saved))

    def sync(self, root_rank: int = 0) -> None:
        """Give every rank `root_rank`'s current values, and keep them as the saved ones."""
        data = bytearray(b"".join(_codec.encode(self._capture()))) if self._books.get_rank() == root_rank else None
        received = _broadcast_bytes(data, root_rank)
        if self._books.get_rank() != root_rank:
            self._apply(_codec.decode(received))
        self.save()

    def _begin(self) -> None:
        """At the start of a launch: take the newest commit of any host (or rank 0's values)."""
        from .._job.objects import allgather_object

        env = environment()
        rank = self._books.get_rank()
        mine: CommitId | str | None = None
        if env.store:
            try:
                mine = StateStore(env.store, env.host_of(rank)).newest()
            except ConfigError as exc:  # the store is not safe to read: every rank stops, naming it
                mine = str(exc)
        found: list[CommitId | str | None] = allgather_object(mine, name="unison.elastic.commits")
        refused = {r: text for r, text in enumerate(found) if isinstance(text, str)}
        if refused:
            first = min(refused)
            others = f" (also ranks {sorted(refused)[1:]})" if len(refused) > 1 else ""
            raise ConfigError(f"rank {first} on host {env.host_of(first)} cannot restore from its elastic "
                              f"store{others}: {refused[first]}")
        newest = max((commit for commit in found if isinstance(commit, CommitId)), default=None)
        if newest is None:
            self.sync()
        else:
            root = found.index(newest)
            data = None
            if rank == root:
                read = StateStore(env.store, env.host_of(rank)).read()
                data = read[1] if read is not None else bytearray()
            received = _broadcast_bytes(data, root)
            store = self._store()
            if store is not None and mine != newest:  # a new host: keep the commit here too
                store.write(newest, [received])
            self._apply(_codec.decode(received))
            self._books.commits = newest.commit
            self._books.saved, self._books.saved_in_store = None, True
        if env.epoch > 0:
            self.on_reset()


class ObjectState(SnapshotState):
    """Picklable values kept as attributes: ``ObjectState(bcast, get_rank, epoch=0, batch=0)``.

    Example:
        >>> state = ObjectState(hvd.broadcast_object, hvd.rank, epoch=0)    # doctest: +SKIP
        >>> state.epoch += 1; state.commit()                               # doctest: +SKIP
    """

    def __init__(self, bcast_object: Callable[..., object], get_rank: Callable[[], int], **kwargs: object) -> None:
        super().__init__(bcast_object, get_rank)
        self._set_values(kwargs)
        self.save()

    def _capture(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._books.names}

    def _apply(self, values: Any) -> None:  # what _capture returned
        for name, value in values.items():
            setattr(self, name, value)


def run(func: Callable[..., _Result]) -> Callable[..., _Result]:
    """Decorate ``train(state, ...)`` for elastic training (``hvd.elastic.run`` of every framework).

    Horovod passes its in-process reset (shutdown, init) to `run_fn`; unison's workers re-form the job
    themselves (`_reform`), so the reset it passes does nothing.
    """
    return run_fn(func, _no_reset)


def _no_reset() -> None:
    """Horovod's in-process reset (shutdown, init); unison's workers re-form the job themselves."""


def _begin(state: State) -> None:
    state._books.new_epoch()
    if isinstance(state, SnapshotState):
        state._begin()
    else:
        state.sync()
        if environment().epoch > 0:
            state.on_reset()


def run_fn(func: Callable[..., _Result], reset: Callable[[], object]) -> Callable[..., _Result]:
    """Wrap `func(state, ...)` for elastic training (what ``hvd.elastic.run`` returns).

    At the start of each epoch the state takes the newest commit of any host, or rank 0's values when
    there is none, and after the first epoch the reset callbacks run. Under the elastic driver a
    worker keeps its process: when the hosts change (after the commit that noticed it) or a collective
    fails because a rank was lost (``HorovodInternalError``), the wrapper tells the driver, leaves the
    epoch, joins the next one and calls `func` again from the restored commit; a worker the next
    epoch has no place for ends with status 0. Where the driver relaunches every process instead, a
    change of hosts ends the process with status `HOSTS_UPDATED_EXIT` and a failure propagates. Other
    errors (the program's own, a mismatch between ranks) propagate. `reset` is Horovod's in-process
    reset; unison re-forms the job itself, so it is not called.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: object, **kwargs: object) -> _Result:
        _begin(state)
        while True:
            try:
                result = func(state, *args, **kwargs)
                state._settle()
                return result
            except HostsUpdatedInterrupt:
                state._settle()
                if not environment().driver:
                    raise
                worker = _reform.worker()
                if worker is None:  # the driver relaunches every process
                    sys.stdout.flush()
                    sys.stderr.flush()
                    raise SystemExit(HOSTS_UPDATED_EXIT) from None
                worker.report_stopped()
            except Exception as exc:
                worker = _reform.worker()
                if worker is None or not _reform.resettable(exc, worker):
                    raise
                state._abandon()
                log.info("epoch %d ended on this rank: %s: %s", worker.epoch, type(exc).__name__, exc)
                worker.report_broken(_reform.lost_ranks(exc))
            _reform.rejoin()
            _begin(state)

    return wrapper


class _HostMessages:
    """Horovod's ``State._host_messages`` as its elastic test scripts use it: only ``empty()``."""

    def __init__(self, state: State) -> None:
        self._state = state

    def empty(self) -> bool:
        """False once the driver announced a change of hosts this epoch has not acted on (rank 0 asks it)."""
        books = self._state._books
        if not environment().driver:
            return True
        self._state._ask_driver()
        return books.driver_updates <= books.known_updates

    def qsize(self) -> int:
        return 0 if self.empty() else 1


def settle_checks(timeout_seconds: float = 10.0) -> None:
    """Called by ``shutdown()``: finish the host check a State left in flight, so that no rank leaves
    while another still waits for that broadcast (a `commit()` outside ``hvd.elastic.run``, or a
    ``hvd.shutdown()`` inside it)."""
    for state in list(_checking):
        state._drop_check(timeout_seconds)
