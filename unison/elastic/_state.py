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
from ._books import BOOKS, Books
from ._checks import HostChecks, settle_checks
from ._environment import HOSTS_UPDATED_EXIT, environment
from .store import CommitId, StateStore

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "SnapshotState", "State", "run", "run_fn", "settle_checks"]

log = logging.getLogger("unison")

_HOST_COMMIT_WAIT_SECONDS = 5.0

_Result = TypeVar("_Result")


class State(HostChecks):
    """What an elastic job keeps across resets: subclasses say how to save, restore and sync it.

    Horovod's interface: ``commit()`` saves and checks for host changes; ``restore()`` returns to the
    last save; ``sync()`` makes every rank hold rank 0's values; ``register_reset_callbacks`` names
    functions called after each reset (at the start of every epoch after the first).
    The values a subclass keeps are attributes named as the user chose; unison's own bookkeeping
    (the commit number among it) lives apart from them, so a value of any name is only a value.
    """

    def __init__(self, bcast_object: Callable[..., object], get_rank: Callable[[], int]) -> None:
        vars(self)[BOOKS] = Books(bcast_object, get_rank)

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


