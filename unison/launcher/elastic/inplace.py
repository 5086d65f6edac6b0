"""unisonrun's elastic driver where the survivors of a membership change keep their processes.

The driver starts every worker itself, one per slot (`workers`), and keeps it for as long as its
host stays in the job. Membership is decided as in the relaunching driver (`membership`, pure);
which worker holds which rank of an epoch, and what a worker is told when it asks, by `roster`
(pure). The driver serves a torch ``TCPStore`` where each epoch's ranks meet and make their gloo
groups, and answers the workers' signed questions on its endpoint (``JOIN``: the epoch to join as
which rank; ``STOPPED``, ``BROKEN``: how the epoch ended there). An epoch ends:

* when a member dies or fails (its marker names why), or peers report it lost (frozen: its heartbeat
  stopped), or it does not join in time: the driver names it, blacklists its host, stops the host's
  other workers, sets the epoch's ``ended`` key in the store (every survivor's watcher abandons the
  epoch's waits) and forms the next epoch from the survivors plus new workers for new slots;
* when every member stopped at the commit after a change of hosts was announced: the same, without
  a failure; workers whose host left are told to leave (they end with status 0);
* when every member finished: the job is done.

Survivors restore the newest commit in their own process; new workers receive it from a survivor
(`unison.elastic._state`). Ctrl-C, SIGTERM and ``--timeout`` reach every worker as they would under
mpiexec, and whatever is alive 3 s later is killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..._contract import (
    ELASTIC_DRIVER_VARIABLE,
    ELASTIC_EPOCH_VARIABLE,
    ELASTIC_HOSTS_VARIABLE,
    ELASTIC_STORE_VARIABLE,
    LAUNCHER_HOSTS_VARIABLE,
)
from ..._job.launch.elastic import format_answer
from ...config import load_settings
from ...elastic.membership import Ending, Epoch, Host, Membership, Stop, blame_hosts, error_of
from ...elastic.roster import Assignment, Leave, Roster, assign
from ...errors import ConfigError
from ..hosts.reach import Reach, address_seen_from
from ..jobs import ElasticRecord
from ..supervision.blame import how_ended
from ..supervision.keeper import horovod_variables
from ..supervision.reaper import JobDirectory
from ..supervision.reports import report_lines
from ..supervision.supervise import interrupt_line, timeout_line
from .discovery import Discovery, say, wait_for_hosts
from .endpoint import Endpoint, driver_host
from .hostcare import (
    as_elastic_host,
    blacklisting,
    is_local,
    remove_remote_stores,
    store_directory,
    unreachable,
)
from .workers import Worker, Workers

__all__ = ["BROKEN_GRACE_SECONDS", "InPlaceDriver", "run_in_place"]

_POLL_SECONDS = 0.01
_MARKERS_EVERY_SECONDS = 0.25  # how often live members' failed markers are read (at every poll after a report)
BROKEN_GRACE_SECONDS = 2.0  # a report of a failed collective that names no one waits this long for a death
INTERRUPT_GRACE_SECONDS = 3.0
RAISED_GRACE_SECONDS = 3.0  # a member named from its own exception's marker is killed if still alive then
_STORE_PREFIX = "unison.elastic"
OMP_WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"  # set for the workers unless the job's environment sets it


@dataclasses.dataclass
class _Failure:
    """One failed member of an epoch: its rank, why, and its exit code when it ended."""

    rank: int
    why: str
    code: int | None = None
    raised: bool = False  # named from its marker while still alive: its own exception, on its way out


@dataclasses.dataclass
class _Watch:
    """What the driver saw of the running epoch so far."""

    began: float
    first_joined: float | None = None  # when the first member joined (the others' bound counts from then)
    looked_at: float = float("-inf")  # when the members' failed markers were read last
    finished: set[str] = dataclasses.field(default_factory=set)
    failures: dict[str, _Failure] = dataclasses.field(default_factory=dict)
    consequences: set[str] = dataclasses.field(default_factory=set)  # members that ended on the epoch's failure
    broken_since: float | None = None  # a member reported a failed collective
    stopped: bool = False  # every member stopped at its commit for a change of hosts


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the driver while it waited for hosts."""


def _exit_code(worker: Worker) -> int | None:
    """How `worker`'s program ended (None while it runs): on another host, as the worker's bootstrap there
    reported it (the command that reached the host ends its own way: a shell with 137 for a program killed by SIGKILL)."""
    if worker.returncode is None or worker.local:
        return worker.returncode
    ended = worker.markers().ended
    return next(iter(ended.values()))[1] if ended else worker.returncode


def _why(worker: Worker, rank: int) -> str:
    """Why `worker` (rank `rank` of the running epoch), which ended, failed."""
    code = _exit_code(worker) or 0
    markers = worker.markers()
    if markers.failed:  # its own error (the newest, if it held several ranks over the epochs)
        newest = max(markers.failed, key=lambda r: markers.written_ns.get(("failed", r), 0))
        return markers.failed[newest]
    where = f"rank {rank} ({worker.host}, pid {worker.pid or worker.proc.pid})"
    if not markers.started:
        return f"{where} {how_ended(code)} before it joined the job."
    if markers.finished:
        return f"{where} {how_ended(code)} after shutting unison down."
    return f"{where} ended without shutting unison down ({how_ended(code)}) while the job was running."


class InPlaceDriver:
    """The elastic driver whose workers keep their processes; `run` returns unisonrun's exit status."""

    def __init__(self, options: Any, program: Sequence[str], *, env: dict[str, str], launcher_exec: str = "",
                 iface: str = "", timeout: float | None = None,
                 on_epoch: Callable[[Epoch], None] | None = None) -> None:
        self.options, self.program, self.env = options, list(program), env
        self.reach = Reach(launcher_exec)
        self.iface, self.timeout, self.on_epoch = iface, timeout, on_epoch
        self.membership = Membership(options.limits)
        self.roster = Roster()
        self.lock = threading.Lock()
        self.endpoint = Endpoint(workers=self._answer)
        self.store: Any = None
        self.workers: Workers | None = None
        self.status: ElasticRecord | None = None
        self.discovery: Discovery | None = None
        self.signals: list[int] = []
        self.waiting_for_hosts = False
        self.started = time.monotonic()
        self.failures = 0
        self.named: set[str] = set()  # workers whose failure was named already
        self.left: set[str] = set()  # workers ending on an error their epoch's failure caused (LEFT)
        self.stores: dict[str, None] = {}  # hosts that may hold a store (removed from remote ones at the end)
        try:
            self.join_seconds = load_settings().start_timeout_seconds or float("inf")
        except ConfigError:
            self.join_seconds = 60.0

    def __repr__(self) -> str:
        return f"<InPlaceDriver {self.roster!r} {self.workers!r}>"

    # -- what the workers ask ---------------------------------------------------------------------

    def _answer(self, kind: str, name: str, epoch: int, numbers: tuple[int, ...]) -> bytes:
        """Answer a worker's signed question (on the endpoint's threads)."""
        workers = self.workers
        if workers is None or name not in workers.workers:
            return format_answer("LEAVE", why="unknown-worker")
        with self.lock:
            if kind == "JOIN":
                workers.reported_pid(name, numbers[0])
                told = self.roster.answer(name, epoch)
                if isinstance(told, Assignment):
                    host = told.epoch.host_of(told.rank)
                    return format_answer("EPOCH", told.epoch.number, told.rank, self._store_address(host),
                                         told.epoch.hosts_argument())
                if isinstance(told, Leave):
                    return format_answer("LEAVE", why=told.why.replace(" ", "-"))
                return format_answer("WAIT")
            if kind == "LEFT":
                self.left.add(name)
            elif kind == "STOPPED":
                self.roster.stopped(name, epoch)
            elif kind == "BROKEN":
                self.roster.broken(name, epoch, numbers)
            return format_answer("OK")

    def _store_address(self, host: str) -> str:
        port = self.store.port
        return f"127.0.0.1:{port}" if is_local(host) else f"{address_seen_from([host])}:{port}"

    # -- the job ------------------------------------------------------------------------------------

    def run(self) -> int:
        store = store_directory()
        with store, JobDirectory("unisonrun-") as job, contextlib.ExitStack() as cleanup:
            self._install_signals(cleanup)
            cleanup.callback(self.endpoint.close)
            self.env[ELASTIC_STORE_VARIABLE] = str(store.path)  # marks every worker for the store's reaper
            # Idle OpenMP threads that spin take the cores gloo's threads need to move the bytes: with
            # torch's default threads, a 2-rank step of a small model took 24-48 ms, 2.6 ms with them asleep.
            self.env.setdefault(OMP_WAIT_POLICY_VARIABLE, "passive")
            self.status = ElasticRecord(str(store.path), self.program, self.membership, self.lock)
            store.remove_too(self.status.record)
            cleanup.callback(self.status.remove)
            cleanup.callback(lambda: remove_remote_stores(self._stores(), str(store.path), self.reach, self.env))
            self.discovery = Discovery(self.options.discovery_script, self.options.slots_per_host,
                                       self.options.discovery_interval, self._on_hosts, self.options.fixed_hosts)
            cleanup.callback(self.discovery.stop)
            self.workers = Workers(job.path, self.program, self.env, self.reach)
            cleanup.callback(self.workers.close)
            self.store = _serve_store()
            try:
                return self._epochs()
            except _Interrupted:
                return self._stop_everyone(interrupted=True)

    def _epochs(self) -> int:
        assert self.discovery is not None and self.status is not None
        while True:
            self.waiting_for_hosts = True
            decision = wait_for_hosts(self.options.elastic_timeout, self.options.timeout_source,
                                      self.options.discovery_interval, self.membership, self.discovery, self.lock,
                                      lambda message: self._published(waiting=message))
            self.waiting_for_hosts = False
            if self.signals:
                raise _Interrupted()
            if isinstance(decision, Stop):
                say(decision.message)
                return 1
            status = self._run_epoch(decision)
            if status is not None:
                return status
            self.discovery.poll()  # plan the next epoch on what discovery says now, not a poll ago

    def _on_hosts(self, hosts: tuple[Any, ...]) -> None:
        with self.lock:
            current = self.membership.current
            if current is not None and self.membership.wants_change(hosts, time.monotonic()):
                self.endpoint.announce(current.number)
        if self.status is not None:
            self.status.publish(hosts)

    def _published(self, **fields: object) -> None:
        if self.status is not None and self.discovery is not None:
            self.status.publish(self.discovery.hosts, **fields)

    def _begin(self, decision: Epoch) -> None:
        """Give `decision`'s ranks to the survivors and to new workers, and let them join."""
        workers = self.workers
        assert workers is not None
        survivors: dict[str, list[str]] = {}
        for name in self.roster.members:  # the last epoch's members, in rank order
            worker = workers.workers[name]
            if worker.alive and not worker.killed:
                survivors.setdefault(worker.host, []).append(name)
        chosen: list[str] = []
        for rank, kept in enumerate(assign(decision, survivors)):
            if kept is None:
                host = decision.host_of(rank)
                kept = workers.start(host, decision.number, rank, self._worker_env(decision, rank, host)).name
            chosen.append(kept)
        with self.lock:
            self.membership.started(decision)
            self.endpoint.begin(decision.number)
            for worker in workers.alive():
                if worker.name not in chosen:
                    self.roster.dismiss(worker.name, f"not a member of epoch {decision.number}")
            self.roster.begin(decision, chosen)
            self.stores.update(dict.fromkeys(host.name for host in decision.hosts))

    def _worker_env(self, decision: Epoch, rank: int, host: str) -> dict[str, str]:
        hosts = decision.hosts_argument()
        extra = {ELASTIC_EPOCH_VARIABLE: str(decision.number), ELASTIC_HOSTS_VARIABLE: hosts,
                 LAUNCHER_HOSTS_VARIABLE: hosts,
                 ELASTIC_DRIVER_VARIABLE: self.endpoint.listen(driver_host(is_local(host), [host]), keep=True)}
        extra.update(horovod_variables({"PMI_RANK": str(rank), "PMI_SIZE": str(decision.np),
                                        LAUNCHER_HOSTS_VARIABLE: hosts}))
        if self.iface:
            extra["GLOO_SOCKET_IFNAME"] = self.iface
        return extra

    def _run_epoch(self, decision: Epoch) -> int | None:
        """Run `decision` until it ends; the exit status when the job ends with it, None to go on."""
        workers, status = self.workers, self.status
        assert workers is not None and status is not None
        self._begin(decision)
        say(f"epoch {decision.number}: {decision.np} ranks on {decision.hosts_argument()}")
        if self.on_epoch is not None:
            self.on_epoch(decision)
        # rank 0's marker directory: where its coordinator service (UNISON_CONTROLLER=grpc) leaves its file
        zero = workers.workers[self.roster.members[0]].directory
        status.publish(self.discovery.hosts if self.discovery else None, epoch=decision.number, np=decision.np,
                       hosts=decision.hosts_argument(), epoch_started=time.time(), running=True, waiting="",
                       launcher_dir=str(zero))
        asked = self.endpoint.statistics()["answered"]  # rank 0 asks at its commits: a sign of progress
        watch = _Watch(began=time.monotonic())
        while True:
            self._look(decision, watch)
            if self.signals or (self.timeout is not None and time.monotonic() - self.started > self.timeout):
                return self._stop_everyone(interrupted=bool(self.signals))
            if watch.failures:
                return self._failed(decision, watch.failures, asked)
            if watch.consequences or (watch.broken_since is not None
                                      and time.monotonic() - watch.broken_since > BROKEN_GRACE_SECONDS):
                return self._failed(decision, {}, asked)  # the epoch broke, and no one is to blame for it
            if watch.finished and watch.finished >= set(self.roster.members):
                status.publish(running=False)
                return 0
            if watch.stopped:
                return self._changed(decision, asked)
            time.sleep(_POLL_SECONDS)

    def _look(self, decision: Epoch, watch: _Watch) -> None:
        """What happened to the epoch's members since the last look: ends, failures, reports, lateness."""
        workers = self.workers
        assert workers is not None
        ended = workers.ended()
        now = time.monotonic()
        if ended or self.roster.broken_reports or now - watch.looked_at > _MARKERS_EVERY_SECONDS:
            watch.looked_at = now  # a member that raised leaves its marker before it aborts the others
            for name in self.roster.members:
                worker = workers.workers[name]
                if name not in watch.failures and name not in self.left and worker.markers().failed:
                    held = self.roster.rank_of(name) or 0
                    watch.failures[name] = _Failure(held, _why(worker, held), worker.returncode,
                                                    raised=worker.alive)
        for worker in ended:
            rank = self.roster.rank_of(worker.name)
            if worker.killed or worker.name in self.named or worker.name in self.roster.leaving:
                continue
            if rank is None:  # a worker of no epoch now (it ended between epochs)
                if worker.returncode != 0 and worker.name not in self.left:
                    print(f"unisonrun: {_why(worker, worker.start_rank)}", file=sys.stderr, flush=True)
                continue
            if worker.name in watch.failures:
                watch.failures[worker.name].code = _exit_code(worker)
                watch.failures[worker.name].raised = False
            elif worker.returncode == 0 and (worker.markers().finished or not worker.markers().started):
                watch.finished.add(worker.name)  # done; or a program that ended well without unison
            elif worker.name in self.left:
                # It ended on an error that its epoch's failure caused (a program without hvd.elastic.run
                # stopped by a lost peer): not its host's fault; a new worker takes its place.
                say(f"rank {rank} ({worker.host}, pid {worker.pid or worker.proc.pid}) ended on the epoch's "
                    f"failure ({how_ended(worker.returncode or 0)}); a new worker takes its place")
                self.named.add(worker.name)
                watch.consequences.add(worker.name)
            else:
                watch.failures[worker.name] = _Failure(rank, _why(worker, rank), _exit_code(worker))
        with self.lock:
            watch.stopped = self.roster.all_stopped()
            lost = [w for w in self.roster.lost_workers() if w not in watch.failures]
            reported = bool(self.roster.broken_reports)
            if watch.first_joined is None and any(name in self.roster.joined for name in self.roster.members):
                watch.first_joined = now
            # As the ranks of a launch wait in init() for each other: a member is late once it has not joined
            # UNISON_START_TIMEOUT_SECONDS after the first did (what a program does before init() is its own).
            late = ([name for name in self.roster.members if name not in self.roster.joined]
                    if watch.first_joined is not None and now - watch.first_joined > self.join_seconds else [])
        for name in lost:
            worker = workers.workers[name]
            rank = self.roster.rank_of(name) or 0
            watch.failures[name] = _Failure(rank, f"rank {rank} ({worker.host}, pid {worker.pid or worker.proc.pid}) "
                                            "stopped answering (its peers found its heartbeat stopped: frozen, or "
                                            "its host unreachable); stopped it.")
        for name in late:
            worker = workers.workers[name]
            rank = self.roster.rank_of(name) or 0
            watch.failures.setdefault(name, _Failure(
                rank, f"rank {rank} ({worker.host}, pid {worker.pid or worker.proc.pid}) did not join epoch "
                f"{decision.number} within {self.join_seconds:g} s of the first rank that did (UNISON_START_TIMEOUT_SECONDS): "
                "frozen or stuck; "
                "stopped it."))
        if reported and watch.broken_since is None:
            watch.broken_since = now

    def _end(self, decision: Epoch) -> None:
        """End `decision`: workers that ask now wait; every survivor's watcher abandons the epoch."""
        with self.lock:
            self.roster.end()
        self.store.set(f"{_STORE_PREFIX}/ended/{decision.number}", "1")
        if self.status is not None:
            self.status.publish(running=False)

    def _changed(self, decision: Epoch, asked: int) -> int | None:
        self._end(decision)
        say(f"epoch {decision.number} committed and stopped for a change of hosts")
        committed = self.endpoint.statistics()["answered"] > asked  # not under the lock: the endpoint's
        with self.lock:  # threads hold its server's lock while they answer, which takes this one
            stop = self.membership.ended(Ending.HOSTS_UPDATED, (), time.monotonic(), committed=committed)
        if stop is not None:
            say(stop.message)
            return 1
        return None

    def _failed(self, decision: Epoch, failures: dict[str, _Failure], asked: int) -> int | None:
        """End `decision` after `failures` (none: a collective failed and nobody was found at fault)."""
        workers = self.workers
        assert workers is not None
        self._end(decision)
        named = {f.rank: as_elastic_host(decision, f.rank, f.why) for f in failures.values()}
        self.named.update(failures)
        workers.kill([workers.workers[name] for name, f in failures.items() if not f.raised])
        # A member whose own exception is on its way out gets a moment to finish its report and exit.
        exiting = [workers.workers[name] for name, f in failures.items() if f.raised]
        if exiting:
            threading.Timer(RAISED_GRACE_SECONDS, workers.kill, (exiting,)).start()
        # A remote worker that ended before it joined: its host may be unreachable (the command that starts
        # it failed). Only those hosts are probed before the next epoch; a survivor's host that vanished
        # ends its worker, which names it.
        unjoined = {decision.host_of(f.rank) for name, f in failures.items()
                    if not workers.workers[name].local and not workers.workers[name].markers().started}
        others = [host.name for host in decision.hosts if host.name not in unjoined]
        away = unreachable(decision, others, self.reach, self.env) if unjoined else {}
        named = {rank: why for rank, why in named.items() if decision.host_of(rank) not in away}
        for line in report_lines(named):
            print(line, file=sys.stderr, flush=True)
        blamed = blame_hosts(decision, named, away)
        with self.lock:
            for name in away:
                self.stores.pop(name, None)
        self._forget_vanished([name for name in blamed if name not in away])
        workers.kill([w for w in workers.alive() if w.host in blamed])
        first = next(iter(failures.values()), None)
        committed = self.endpoint.statistics()["answered"] > asked  # not under the lock (see `_changed`)
        with self.lock:
            now = time.monotonic()
            stop = self.membership.ended(Ending.FAILED, blamed, now, committed=committed,
                                         error=error_of(first.why) if first is not None else None)
        self.failures += 1
        if self.status is not None:
            self.status.publish(failures=self.failures)
        if first is None:
            how = "a collective failed; no rank was found lost"
        elif first.raised:
            how = "exit status 1"  # a rank ends with status 1 after an uncaught exception (docs/launcher.md)
        elif first.code is None:
            how = f"rank {first.rank} lost"
        else:
            how = f"exit status {128 - first.code if first.code < 0 else first.code or 1}"
        say(f"epoch {decision.number} failed ({how})" + blacklisting(self.membership, blamed, now))
        if stop is not None:
            say(stop.message)
            return 1
        return None

    def _stores(self) -> list[str]:
        """The hosts that may hold the job's store now."""
        with self.lock:
            return list(self.stores)

    def _forget_vanished(self, hosts: Sequence[str]) -> None:
        """In the background: drop from the stores to remove at the end those of `hosts` that cannot be
        reached any more (they took their store with them)."""
        if not any(not is_local(name) for name in hosts):
            return

        def probe() -> None:
            for name in hosts:  # one by one: several failing alike is no sign of this host's trouble here
                if unreachable(Epoch(-1, (Host(name, 1),)), (), self.reach, self.env):
                    with self.lock:
                        self.stores.pop(name, None)

        threading.Thread(target=probe, name="unison-elastic-probe", daemon=True).start()

    # -- stopping -----------------------------------------------------------------------------------

    def _install_signals(self, cleanup: contextlib.ExitStack) -> None:
        def on_signal(signum: int, frame: object) -> None:
            self.signals.append(signum)
            if self.waiting_for_hosts:
                raise _Interrupted()

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.signal(sig, on_signal)
            except ValueError:  # not the main thread (unison.run from a thread): no forwarding
                continue
            cleanup.callback(signal.signal, sig, previous)

    def _stop_everyone(self, interrupted: bool) -> int:
        """Stop every worker as Ctrl-C (or SIGTERM) would under mpiexec; the exit status."""
        workers = self.workers
        signum = self.signals[0] if interrupted and self.signals else signal.SIGINT
        if not interrupted:
            print(timeout_line(self.timeout, stopped=False), file=sys.stderr, flush=True)
        if workers is not None:
            workers.signal(signum)
            deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
            while workers.alive() and time.monotonic() < deadline:
                workers.ended()
                if len(self.signals) > 1:
                    break  # a second Ctrl-C: at once
                time.sleep(_POLL_SECONDS)
            workers.kill(workers.alive())
        if interrupted:
            print(interrupt_line(signum), file=sys.stderr, flush=True)
            return 128 + signum
        return 124


def _serve_store() -> Any:
    """A torch ``TCPStore`` served by this process on a free port (every interface), for the workers' epochs."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))


def run_in_place(options: Any, program: Sequence[str], *, env: dict[str, str], launcher_exec: str = "",
                 iface: str = "", timeout: float | None = None,
                 on_epoch: Callable[[Epoch], None] | None = None) -> int:
    """Run `program` elastically with workers that keep their processes; unisonrun's exit status."""
    return InPlaceDriver(options, program, env=env, launcher_exec=launcher_exec, iface=iface, timeout=timeout,
                         on_epoch=on_epoch).run()

