"""The elastic launch: a worker of an elastic job that joins one membership epoch after another in one process.

unisonrun's elastic driver starts each worker itself and keeps it for as long as its host stays in the
job (``unison/launcher/elastic/``). A worker is named by the last part of its launcher directory
(``UNISON_LAUNCHER_DIR=.../w3``, where its marker files go) and asks the driver, in lines signed
under the key of ``UNISON_ELASTIC_DRIVER`` (`unison._contract.ask_signed`), which epoch to join as
which rank: ``JOIN w3 <last epoch> <pid> <nonce>``, answered ``EPOCH <n> <rank> <store> <hosts>``,
``WAIT`` (ask again) or ``LEAVE <why>``; it says how an epoch ended here with ``STOPPED`` (at the
commit after a change of hosts), ``BROKEN`` (a collective failed) and ``LEFT`` (the process ends on an
error that the epoch's failure caused). The ranks of an epoch meet at the driver's torch store (a
``TCPStore`` served by the driver, each epoch's keys under ``unison.elastic/e<n>``), check that every
rank arrived, agree on settings and run on the gloo transport (`unison.backends.gloo`), groups of
their own per epoch. When the driver ends an epoch (a worker died or was found lost, or every rank
stopped for a change of hosts) it sets the key ``unison.elastic/ended/<n>``; a watcher thread in
each worker looks for that key on a connection of its own and makes the epoch's transport abandon
its waits, so that no rank stays blocked on a peer that is gone. The ``run`` wrapper of the elastic
states (`unison.elastic._state`) then leaves the job locally (`unison._job.runtime.leave_job`) and
calls ``init()`` again, which joins the next epoch in the same process.

The elastic variables of the process (``UNISON_ELASTIC_EPOCH``, ``UNISON_ELASTIC_HOSTS``) are set to
the epoch joined, so that whatever reads the settings (the host names in messages, the commits'
epoch, ``unison.run``'s outcome directory) sees the epoch this process is in now.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import re
import secrets
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from ..._contract import ELASTIC_EPOCH_VARIABLE, ELASTIC_HOSTS_VARIABLE, ask_signed, parse_hosts
from ...backends import create_backend
from ...backends.base import Backend
from ...config import Settings
from ...errors import ConfigError, HorovodInternalError, MismatchError, MissingGradientError, StartupError
from .. import failure as _failure
from .base import Launch, Place, agree_settings
from .rendezvous import place_of

__all__ = ["ElasticLaunch", "ElasticWorker", "Joined", "elastic_worker", "format_answer", "parse_question",
           "worker_name"]

log = logging.getLogger("unison")

_WORKER = re.compile(r"w[0-9]{1,9}")
_WORD = re.compile(r"[A-Za-z0-9_.:,\[\]-]{1,1024}")
_ASK_TIMEOUT_SECONDS = 2.0
_FIRST_ASK_SECONDS = 0.01  # while waiting for the next epoch: asked again this soon, backing off to
_MAX_ASK_SECONDS = 0.1  # this (a new worker takes seconds to start; a survivor's epoch is often ready at once)
_DRIVER_SILENT_SECONDS = 30.0  # no answer from the driver this long: it is gone
_STORE_PREFIX = "unison.elastic"
_WATCH_SECONDS = 0.05  # how often the watcher looks for the end of its epoch
_POLL_SECONDS = 0.005
_MAX_POLL_SECONDS = 0.05


def worker_name(settings: Settings) -> str | None:
    """This process's name as a worker of the elastic driver (``w3``), None when the driver did not start it.

    Example:
        >>> worker_name(Settings(elastic_driver="k@h:1", launcher_dir="/tmp/unisonrun-x/w3"))
        'w3'
        >>> worker_name(Settings(elastic_driver="k@h:1", launcher_dir="/tmp/unisonrun-x")) is None
        True
    """
    if not settings.elastic_driver or not settings.launcher_dir:
        return None
    name = os.path.basename(settings.launcher_dir.rstrip("/"))
    return name if _WORKER.fullmatch(name) else None


# -- the lines between a worker and the driver ------------------------------------------------------


def parse_question(question: bytes) -> tuple[str, str, int, tuple[int, ...]] | None:
    """A worker's question as (kind, worker, epoch, numbers), None when it is not one. Pure.

    ``JOIN w3 2 4242 NONCE`` (its last epoch, -1 before the first, and its pid), ``STOPPED w3 2 NONCE``,
    ``BROKEN w3 2 1,3 NONCE`` (the ranks found lost, ``-`` for none), ``LEFT w3 2 NONCE`` (it ends with
    an error its epoch's failure caused).

    Example:
        >>> parse_question(b"JOIN w3 -1 4242 9f"), parse_question(b"BROKEN w3 2 1,3 9f")
        (('JOIN', 'w3', -1, (4242,)), ('BROKEN', 'w3', 2, (1, 3)))
    """
    words = question.decode("ascii", errors="replace").split()
    if len(words) < 4 or words[0] not in ("JOIN", "STOPPED", "BROKEN", "LEFT") or not _WORKER.fullmatch(words[1]):
        return None
    kind, worker = words[0], words[1]
    try:
        epoch = int(words[2])
        if kind == "JOIN" and len(words) == 5:
            return kind, worker, epoch, (int(words[3]),)
        if kind in ("STOPPED", "LEFT") and len(words) == 4:
            return kind, worker, epoch, ()
        if kind == "BROKEN" and len(words) == 5:
            lost = () if words[3] == "-" else tuple(int(r) for r in words[3].split(","))
            return kind, worker, epoch, lost
    except ValueError:
        return None
    return None


def format_answer(kind: str, epoch: int = 0, rank: int = 0, store: str = "", hosts: str = "", why: str = "") -> bytes:
    """The driver's answer: ``EPOCH <n> <rank> <store> <hosts>``, ``WAIT``, ``LEAVE <why>`` or ``OK``.

    Example:
        >>> format_answer("EPOCH", 2, 1, "10.0.0.1:29400", "a:1,b:1")
        b'EPOCH 2 1 10.0.0.1:29400 a:1,b:1'
    """
    if kind == "EPOCH":
        return f"EPOCH {epoch} {rank} {store} {hosts}".encode()
    if kind == "LEAVE":
        return f"LEAVE {why}".encode()
    return kind.encode()


@dataclasses.dataclass(frozen=True)
class Joined:
    """The epoch a worker was told to join: its number, this worker's rank, the store, the hosts in rank order."""

    epoch: int
    rank: int
    store: str  # HOST:PORT of the driver's torch store
    hosts: str  # host:slots,... as the driver wrote it

    @property
    def ranks_hosts(self) -> list[str]:
        """Each rank's host, in rank order."""
        return [name for name, slots in parse_hosts(self.hosts, ELASTIC_HOSTS_VARIABLE) for _ in range(slots)]

    @property
    def size(self) -> int:
        return len(self.ranks_hosts)


def _parse_answer(answer: bytes) -> Joined | str | None:
    """EPOCH as `Joined`; ``WAIT``; ``LEAVE <why>`` as its text (prefixed ``LEAVE``); None for anything else."""
    text = answer.decode("ascii", errors="replace")
    words = text.split()
    if words[:1] == ["EPOCH"] and len(words) == 5 and all(_WORD.fullmatch(w) for w in words[1:]):
        try:
            return Joined(int(words[1]), int(words[2]), words[3], words[4])
        except ValueError:
            return None
    if words[:1] == ["WAIT"]:
        return "WAIT"
    if words[:1] == ["LEAVE"]:
        return text
    return None


# -- the worker: this process across epochs -----------------------------------------------------------


class ElasticWorker:
    """This process as a worker of the elastic driver: its name, its driver, the store, the epoch it is in.

    One per process (`elastic_worker`). `next_epoch` asks the driver until it names the next epoch (or
    says to leave: ``SystemExit(0)``); `report_stopped` and `report_broken` tell the driver how the
    epoch went here. The watcher thread abandons an epoch's transport once the driver ends the epoch.
    """

    def __init__(self, name: str, driver: str) -> None:
        self.name, self.driver = name, driver
        self.joined: Joined | None = None
        self.asked = 0
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._backends: dict[int, Backend] = {}  # epoch -> its transport, until the epoch ended
        self._ended: set[int] = set()
        self._changed = threading.Condition(self._lock)
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()

    def __repr__(self) -> str:
        epoch = self.joined.epoch if self.joined is not None else None
        return f"<ElasticWorker {self.name} epoch={epoch} questions={self.asked}>"

    @property
    def epoch(self) -> int:
        """The epoch this worker joined last (-1 before the first)."""
        return self.joined.epoch if self.joined is not None else -1

    def _ask(self, question: str) -> bytes | None:
        self.asked += 1
        return ask_signed(self.driver, f"{question} {secrets.token_hex(8)}".encode(), _ASK_TIMEOUT_SECONDS)

    def next_epoch(self) -> Joined:
        """Ask the driver until it names the epoch after the one joined last; set this process's elastic variables.

        Raises:
            SystemExit: (status 0) the driver says the job goes on without this worker.
            StartupError: the driver did not answer for 30 s (it is gone).
        """
        silent_since = time.monotonic()
        delay = _FIRST_ASK_SECONDS
        while True:
            reply = self._ask(f"JOIN {self.name} {self.epoch} {os.getpid()}")
            answer = _parse_answer(reply) if reply is not None else None
            if isinstance(answer, Joined):
                self._enter(answer)
                return answer
            if isinstance(answer, str) and answer.startswith("LEAVE"):
                log.debug("worker %s leaves the job: %s", self.name, answer[6:])
                raise SystemExit(0)
            if answer is None:
                if time.monotonic() - silent_since > _DRIVER_SILENT_SECONDS:
                    raise StartupError(f"init() failed: the elastic driver at {self.driver.rpartition('@')[2]} did "
                                       f"not answer worker {self.name} for {_DRIVER_SILENT_SECONDS:.0f} s; it is gone.")
            else:
                silent_since = time.monotonic()
            time.sleep(delay)
            delay = min(delay * 2, _MAX_ASK_SECONDS)

    def _enter(self, joined: Joined) -> None:
        with self._lock:
            self.joined = joined
            self._changed.notify_all()
        # Settings read from now on describe this epoch (see the module's docstring).
        os.environ[ELASTIC_EPOCH_VARIABLE] = str(joined.epoch)
        os.environ[ELASTIC_HOSTS_VARIABLE] = joined.hosts
        self._start_watcher()

    def report_stopped(self) -> None:
        """Tell the driver this worker committed and stopped for the change of hosts (best effort)."""
        self._ask(f"STOPPED {self.name} {self.epoch}")

    def report_exit(self) -> None:
        """At exit: when the process ends with an uncaught error that its epoch's failure caused (a program
        without ``hvd.elastic.run`` that a lost peer stopped), tell the driver, which then starts a new
        worker in its place instead of blaming its host (best effort)."""
        error = getattr(sys, "last_value", None)
        if isinstance(error, HorovodInternalError) and not isinstance(error, (MismatchError, MissingGradientError)):
            self._ask(f"LEFT {self.name} {self.epoch}")

    def report_broken(self, lost: tuple[int, ...]) -> None:
        """Tell the driver a collective of this epoch failed here; `lost`: the ranks found lost (best effort)."""
        self._ask(f"BROKEN {self.name} {self.epoch} {','.join(map(str, lost)) or '-'}")

    def store(self, address: str, own: bool = False) -> Any:
        """A client of the driver's torch store at `address` (`own`: a connection of its own, not shared)."""
        import torch.distributed as dist

        key = f"{address} watcher" if own else address
        with self._lock:
            client = self._stores.get(key)
        if client is None:
            host, _, port = address.rpartition(":")
            client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60),
                                   wait_for_workers=False)
            with self._lock:
                self._stores[key] = client
        return client

    def ended(self, epoch: int) -> bool:
        """Whether the driver ended `epoch` (the watcher saw its key)."""
        with self._lock:
            return epoch in self._ended

    def track(self, epoch: int, backend: Backend) -> None:
        """Abandon `backend`'s waits once the driver ends `epoch` (at once if it has)."""
        with self._lock:
            self._backends[epoch] = backend
            done = epoch in self._ended
        if done:
            backend.abandon()

    def _start_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="unison-elastic-watcher", daemon=True)
            self._watcher.start()
            atexit.register(self.stop_watcher)
            atexit.register(self.report_exit)

    def stop_watcher(self) -> None:
        """End the watcher thread (at exit: a daemon thread still inside torch's C++ when the interpreter
        finalizes is unwound through code that cannot be, and the process ends with SIGABRT)."""
        self._stopping.set()
        with self._lock:
            self._changed.notify_all()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(1.0)

    def _watch(self) -> None:
        """Watch for the end of each epoch this worker joins; abandon that epoch's transport.

        It polls (a key check every 50 ms on a connection of its own) rather than blocking in the
        store's wait: a thread blocked in torch's C++ at exit ends the process with SIGABRT.
        """
        watched = -1
        while not self._stopping.is_set():
            with self._lock:
                while (self.joined is None or self.joined.epoch <= watched) and not self._stopping.is_set():
                    self._changed.wait()
                if self.joined is None or self._stopping.is_set():
                    return
                watched, address = self.joined.epoch, self.joined.store
            key = f"{_STORE_PREFIX}/ended/{watched}"
            try:
                client = self.store(address, own=True)
                while not client.check([key]):
                    if self._stopping.wait(_WATCH_SECONDS):
                        return
            except Exception:  # noqa: BLE001 - the driver (and its store) is gone: the job is ending
                return
            with self._lock:
                self._ended.add(watched)
                backend = self._backends.pop(watched, None)
            if backend is not None:
                log.debug("epoch %d ended: abandoning its transport", watched)
                backend.abandon()


_worker: list[ElasticWorker] = []


def elastic_worker(settings: Settings) -> ElasticWorker | None:
    """This process's `ElasticWorker` when the elastic driver started it as one (made at the first call)."""
    if _worker:
        return _worker[0]
    name = worker_name(settings)
    if name is None:
        return None
    _worker.append(ElasticWorker(name, settings.elastic_driver))
    return _worker[0]


def current_worker() -> ElasticWorker | None:
    """The `ElasticWorker` of this process, if `elastic_worker` made one."""
    return _worker[0] if _worker else None


# -- the launch: one epoch ---------------------------------------------------------------------------------


class ElasticLaunch(Launch):
    """One epoch of an elastic worker: join it (asking the driver), meet its ranks at the store, run on gloo."""

    name = "elastic"
    reforms_in_place = True

    def __init__(self, worker: ElasticWorker) -> None:
        self.worker = worker
        self.joined: Joined | None = None
        self.store: Any = None
        self._exchanges = 0
        self._backend: Backend | None = None
        self._bound_seconds = 60.0  # how long the ranks wait for each other (UNISON_START_TIMEOUT_SECONDS)

    def __repr__(self) -> str:
        return f"<ElasticLaunch {self.worker.name} joined={self.joined}>"

    @property
    def rank(self) -> int:
        return self._joined.rank

    @property
    def size(self) -> int:
        return self._joined.size

    @property
    def epoch(self) -> int:
        return self._joined.epoch

    @property
    def _joined(self) -> Joined:
        if self.joined is None:
            raise RuntimeError("the elastic launch has not joined an epoch yet")
        return self.joined

    def join(self, settings: Settings) -> None:
        self._join()

    def _join(self) -> None:
        self.joined = self.worker.next_epoch()
        self.store = _prefixed(self.worker.store(self.joined.store), f"{_STORE_PREFIX}/e{self.joined.epoch}")
        self._exchanges = 0

    def _bound(self, settings: Settings) -> float:
        return settings.start_timeout_seconds if settings.start_timeout_seconds > 0 else float("inf")

    def check_start(self, problem: BaseException | None, settings: Settings) -> None:
        """Form the epoch: meet its ranks at the store, agree on settings, connect the transport. When the
        driver ends the epoch meanwhile, or a rank does not arrive (reported to the driver, which stops
        it), join the next epoch and form that one instead."""
        from .hosts import host_name

        if problem is not None:
            text = f"{type(problem).__name__}: {problem}"
            _failure.mark_failed_start(self.rank, f"rank {self.rank} ({host_name(settings, self.rank)}, pid "
                                       f"{os.getpid()}) could not start: {text}", settings.launcher_dir,
                                       settings.launcher_relay)
            raise problem
        self._bound_seconds = self._bound(settings)
        while True:
            try:
                self._meet(self._bound_seconds)
                agree_settings(self.exchange, settings)
                self._backend = self._connect(settings)
                return
            except _EpochEnded:
                log.debug("epoch %d ended while its ranks met; joining the next one", self.epoch)
            except ConfigError:
                raise  # the ranks' settings differ: no other epoch would agree either
            except StartupError as exc:
                log.debug("%s", exc)
                self.worker.report_broken(exc.missing_ranks)
            except Exception as exc:  # noqa: BLE001 - the transport failed to form: reported, then the next epoch
                log.debug("epoch %d: the transport failed to form: %r", self.epoch, exc)
                self.worker.report_broken(())
            self._join()

    def _meet(self, bound: float) -> None:
        """Every rank of the epoch reports here; return once all did, within `bound` seconds."""
        joined = self._joined
        self.store.set(f"report/{joined.rank}", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        keys = [f"report/{r}" for r in range(joined.size)]
        deadline = time.monotonic() + bound
        self._wait_for(keys, deadline)

    def _wait_for(self, keys: list[str], deadline: float) -> None:
        """Poll until every key of `keys` is in the store; `_EpochEnded` when the driver ends the epoch first,
        `StartupError` naming the ranks whose keys are missing at the deadline."""
        delay = _POLL_SECONDS
        while not self.store.check(keys):
            if self.worker.ended(self.epoch):
                raise _EpochEnded()
            if time.monotonic() >= deadline:
                missing = tuple(r for r, key in enumerate(keys) if not self.store.check([key]))
                who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {list(missing)}"
                raise StartupError(f"epoch {self.epoch} of the elastic job did not form: {who} did not arrive "
                                   "within UNISON_START_TIMEOUT_SECONDS (frozen, or lost on the way).", missing)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_POLL_SECONDS)

    def place(self) -> Place:
        return place_of(self.rank, self._joined.ranks_hosts)

    def exchange(self, payload: bytes) -> list[bytes]:
        """Every rank's payload through the store (bounded like the meeting; ended with the epoch)."""
        self._exchanges += 1
        keys = [f"exchange/{self._exchanges}/{r}" for r in range(self.size)]
        self.store.set(keys[self.rank], payload)
        self._wait_for(keys, time.monotonic() + self._bound_seconds)
        return [bytes(self.store.get(key)) for key in keys]

    def connect(self, settings: Settings, place: Place) -> Backend:
        """The transport `check_start` formed."""
        if self._backend is None:
            raise RuntimeError("the elastic launch connects in check_start")
        backend, self._backend = self._backend, None
        return backend

    def _connect(self, settings: Settings) -> Backend:
        """The gloo transport of this epoch, made in a thread so that an epoch ended meanwhile is left at once."""
        from ...backends.gloo import GlooWorld

        bound = self._bound(settings)
        gloo_timeout = max(60.0, bound) if bound != float("inf") else 1800.0
        world = GlooWorld(self.store, self.rank, self.size, timeout_seconds=gloo_timeout,
                          peer_timeout_seconds=settings.peer_timeout_seconds)
        made: list[Backend | BaseException] = []
        place = self.place()
        thread = threading.Thread(target=_make, args=(world, settings, place, made), daemon=True,
                                  name="unison-elastic-connect")
        thread.start()
        deadline = time.monotonic() + gloo_timeout
        while thread.is_alive():
            thread.join(_MAX_POLL_SECONDS)
            if self.worker.ended(self.epoch):
                raise _EpochEnded()
            if time.monotonic() > deadline:
                raise StartupError(f"epoch {self.epoch} of the elastic job: the ranks' gloo connections did not "
                                   f"form within {gloo_timeout:g} s.")
        result = made[0]
        if isinstance(result, BaseException):
            raise result
        self.worker.track(self.epoch, result)
        return result


class _EpochEnded(Exception):
    """The driver ended the epoch while its ranks met: join the next one."""


def _make(world: Any, settings: Settings, place: Place, made: list[Backend | BaseException]) -> None:
    try:
        data = create_backend("gloo", world, settings)
        if settings.controller == "grpc":  # the coordinator service on rank 0, over this epoch's gloo
            from ...service.setup import grpc_over

            data = grpc_over(data, settings, place.local_size)
        made.append(data)
    except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
        made.append(exc)


def _prefixed(store: Any, prefix: str) -> Any:
    import torch.distributed as dist

    return dist.PrefixStore(prefix, store)
