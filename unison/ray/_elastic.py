"""An elastic `RayExecutor`: one set of fresh workers per membership epoch, as unisonrun's elastic driver runs one launch per epoch.

unison's elastic mode (docs/elastic.md) resets a job by starting it again: a new membership epoch
is a new set of processes that restore the newest commit and go on. Here each epoch is a new set of
Ray actors, pinned to the epoch's hosts (the Ray resource ``node:<host>``), numbered host by host,
meeting through torch's ``env://`` rendezvous at rank 0. The decisions are those of unisonrun's
driver (`unison.elastic.membership`: hosts, blacklist, resets, when to give up), and so are the
signals: rank 0 asks the driver's signed endpoint at its commits whether the hosts changed, every
rank then ends its call after the commit (``HOSTS_UPDATED_EXIT``), and the commits live in a
directory under ``/dev/shm`` on each host, read when the next epoch starts.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence, Set
from typing import Any

from .._contract import (
    ELASTIC_DRIVER_VARIABLE,
    ELASTIC_EPOCH_VARIABLE,
    ELASTIC_HOSTS_VARIABLE,
    ELASTIC_STORE_VARIABLE,
)
from ..elastic.membership import Ending, Epoch, Limits, Membership, Stop, Wait, blame_hosts, error_of
from ..errors import InvalidArgumentError, LaunchError, UnisonNotImplementedError
from ..launcher.elastic.endpoint import Endpoint
from ._calls import Callbacks, calling, end_workers, gather
from ._discovery import DiscoveryPoller, RayHostDiscovery
from ._layout import place, rank_variables
from ._outcomes import failed_ranks, failure_message
from ._settings import MiniSettings
from ._static import common_variables
from ._worker import BaseHorovodWorker, Outcome

__all__ = ["ElasticAdapter", "in_ray_words", "start_outcomes"]

log = logging.getLogger("unison.ray")

_RAY_WORDS = (("--min-np", "min_workers"), ("--max-np", "max_workers"), ("--reset-limit", "reset_limit"),
              ("--elastic-timeout", "elastic_timeout"), ("--blacklist-cooldown-range A B", "cooldown_range=(A, B)"),
              ("the discovery script", "discovery"), ("--blacklist-cooldown-range", "cooldown_range"))


def in_ray_words(message: str) -> str:
    """A membership message with unisonrun's option names replaced by the executor's argument names.

    Example:
        >>> in_ray_words("1 ranks available, 2 needed (--min-np 2)")
        '1 ranks available, 2 needed (min_workers 2)'
    """
    for flag, name in _RAY_WORDS:
        message = re.sub(re.escape(flag) + r"(?![\w-])", name, message)
    return message


def start_outcomes(started: Sequence[bool], names: Sequence[str], hosts: Sequence[str], missing: Set[str],
                   waited: float, cpus_per_worker: float) -> list[Outcome]:
    """Each rank's `Outcome` when some workers had not started after `waited` seconds: a host in
    `missing` (no alive Ray node stands for it) is blamed; a worker of another host that had not started
    is blamed only when no host is missing (Ray had no room for it), for beside a missing node a slow
    start is no fault of its host.

    >>> [o.cause for o in start_outcomes([True, False, False], ["r0", "r1", "r2"], ["a", "b", "c"], {"c"}, 5, 1)]
    [False, False, True]
    """
    absent = ", ".join(sorted(missing))

    def outcome(ran: bool, name: str, host: str) -> Outcome:
        if ran:
            return Outcome("ok")
        if host in missing:
            return Outcome("failed", cause=True, reason=f"{name}: no Ray node stood for that host within {waited:g} s "
                           f"(placement_group_timeout_s): no alive node has the resource node:{host}")
        if missing:
            return Outcome("failed", reason=f"{name}: its worker had not started within {waited:g} s, when the epoch "
                           f"ended for want of a Ray node for {absent}")
        return Outcome("failed", cause=True, reason=f"{name}: its worker did not start within {waited:g} s "
                       f"(placement_group_timeout_s): Ray has no free room on that host (a node with the resource "
                       f"node:{host} and {cpus_per_worker:g} CPUs free)")

    return [outcome(ran, name, host) for ran, name, host in zip(started, names, hosts)]


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class ElasticAdapter:
    """The epochs of an elastic `RayExecutor`: discovery, workers per epoch, the driver's endpoint and commits."""

    def __init__(self, settings: MiniSettings, min_workers: int, max_workers: int | None = None,
                 use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: float | None = None,
                 override_discovery: bool = True, reset_limit: int | None = None,
                 cooldown_range: tuple[float, float] | None = None, elastic_timeout: float = 600) -> None:
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu, cpus_per_worker, gpus_per_worker or 1)
        elif settings.discovery is None:
            raise InvalidArgumentError("override_discovery=False keeps settings.discovery, which is None. Set "
                                       "settings.discovery to an object with find_available_hosts_and_slots(), or "
                                       "leave override_discovery=True to discover Ray's nodes.")
        try:
            self.limits = Limits(min_workers, max_workers, reset_limit, cooldown_range)
        except LaunchError as exc:
            raise InvalidArgumentError(in_ray_words(str(exc))) from None
        self.settings = settings
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.elastic_timeout = elastic_timeout
        self.lock = threading.Lock()
        self.membership: Membership | None = None
        self.endpoint = Endpoint()
        self.poller: DiscoveryPoller | None = None
        self.store_prefix = ""  # each run's commits: STORE_PREFIX-N, made by its first writer on each host
        self.nodes: set[str] = set()  # Ray nodes that ran workers: each may hold commits under the store
        self.runs = 0
        self.start_args: tuple[type | None, list[Any], dict[str, Any], dict[str, str]] = (None, [], {}, {})

    def __repr__(self) -> str:
        return f"<ElasticAdapter limits={self.limits}, membership={self.membership!r}, runs={self.runs}>"

    def statistics(self) -> dict[str, int]:
        counts = dict(self.membership.statistics()) if self.membership else {}
        counts.update(runs=self.runs, **{f"endpoint_{k}": v for k, v in self.endpoint.statistics().items()})
        return counts

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, Any] | None = None) -> None:
        """Start discovering hosts and wait until they offer `min_workers` slots (or `elastic_timeout` passes)."""
        self.start_args = (executable_cls, list(executable_args or []), dict(executable_kwargs or {}),
                           {name: str(value) for name, value in (extra_env_vars or {}).items()})
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        # A directory of /dev/shm itself: another node has /dev/shm, not a parent made on this one.
        self.store_prefix = os.path.join(shm, f"unison-ray-elastic-{os.getuid()}-{secrets.token_hex(6)}")
        self.poller = DiscoveryPoller(self.settings.discovery, self.settings.discovery_interval_s, self._on_hosts)
        decision = self._wait_for_hosts(Membership(self.limits))
        if isinstance(decision, Stop):
            self.shutdown()
            raise LaunchError(in_ray_words(decision.message))

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker of each epoch; the last epoch's values, in rank order."""
        return self._epochs("RayExecutor.run", calling(fn, args, kwargs), callbacks)

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(executable)`` on every worker of each epoch; the last epoch's values, in rank order."""
        return self._epochs("RayExecutor.execute", fn, callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        raise UnisonNotImplementedError("An elastic RayExecutor cannot return object refs: its workers change "
                                        "from epoch to epoch. Call run() instead.")

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        raise UnisonNotImplementedError("An elastic RayExecutor has no fixed rank 0 worker to run on. Call "
                                        "execute() instead.")

    def shutdown(self) -> None:
        """Stop discovering and close the endpoint (each run removed its commits when it ended)."""
        if self.poller is not None:
            self.poller.stop()
            self.poller = None
        self.endpoint.close()

    # -- epochs ----------------------------------------------------------------------------------------

    def _on_hosts(self, hosts: Sequence[Any]) -> None:
        """Discovery's answer: when the running epoch should have other hosts, announce it to its rank 0."""
        with self.lock:
            membership = self.membership
            if membership is not None and membership.current is not None \
                    and membership.wants_change(tuple(hosts), time.monotonic()):
                self.endpoint.announce(membership.current.number)

    def _wait_for_hosts(self, membership: Membership) -> Epoch | Stop:
        assert self.poller is not None  # start() made it
        deadline = time.monotonic() + self.elastic_timeout
        said = ""
        while True:
            with self.lock:
                decision = membership.plan(self.poller.hosts, time.monotonic())
            if not isinstance(decision, Wait):
                return decision
            if time.monotonic() >= deadline:
                return Stop(f"waited {self.elastic_timeout:g} s (elastic_timeout) for hosts: "
                            f"{in_ray_words(decision.message)}. Add hosts, or lower min_workers.")
            if decision.message != said:
                said = decision.message
                log.info("waiting for hosts: %s", in_ray_words(said))
            self.poller.changed.clear()
            self.poller.changed.wait(min(self.settings.discovery_interval_s, max(0.0, deadline - time.monotonic()))
                                     + 0.01)

    def _epochs(self, what: str, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], object]] | None
                ) -> list[Any]:
        if self.poller is None:
            from ..errors import NotInitializedError

            raise NotInitializedError(f"{what}() was called before start() or after shutdown(). Call start() first.")
        self.runs += 1
        store = f"{self.store_prefix}-{self.runs}"  # each run is a job of its own: its own commits
        membership = Membership(self.limits)
        with self.lock:
            self.membership = membership
        pump = Callbacks(callbacks)
        try:
            while True:
                decision = self._wait_for_hosts(membership)
                if isinstance(decision, Stop):
                    raise LaunchError(f"{what}: {in_ray_words(decision.message)}")
                with self.lock:
                    membership.started(decision)
                    self.endpoint.begin(decision.number)
                asked = self.endpoint.statistics()["answered"]
                log.info("epoch %d: %d ranks on %s", decision.number, decision.np, decision.hosts_argument())
                outcomes = self._run_epoch(decision, fn, pump, store)
                if all(outcome.status == "ok" for outcome in outcomes):
                    return [outcome.value for outcome in outcomes]
                failed = [rank for rank, outcome in enumerate(outcomes) if outcome.status == "failed"]
                ending = Ending.FAILED if failed else Ending.HOSTS_UPDATED
                causes = [rank for rank in failed_ranks(outcomes) if outcomes[rank].cause]
                blamed = blame_hosts(decision, causes, {}) if ending is Ending.FAILED else {}
                first = outcomes[causes[0]].reason if causes else ""
                with self.lock:
                    stop = membership.ended(ending, blamed, time.monotonic(),
                                            committed=self.endpoint.statistics()["answered"] > asked,
                                            error=error_of(first) if first else None)
                if ending is Ending.FAILED:
                    log.warning("%s", failure_message(f"epoch {decision.number}", outcomes,
                                                      f"blacklisting {', '.join(blamed) or 'no host'}"))
                else:
                    log.info("epoch %d committed and stopped for a change of hosts", decision.number)
                if stop is not None:
                    listing = failure_message(f"epoch {decision.number}", outcomes) if failed else ""
                    raise LaunchError(f"{what}: {in_ray_words(stop.message)}" + (f"\n{listing}" if listing else ""))
                if self.poller is not None:
                    self.poller.poll()  # plan the next epoch on what discovery says now
        finally:
            with self.lock:
                self.membership = None
            pump.close()
            self._remove_store(store)

    def _run_epoch(self, epoch: Epoch, fn: Callable[[Any], Any], pump: Callbacks, store: str) -> list[Outcome]:
        """Start the epoch's workers, run `fn` on them, end them; every rank's `Outcome`."""
        import ray

        hosts = [epoch.host_of(rank) for rank in range(epoch.np)]
        places = place(hosts)
        names = [f"rank {rank} ({host})" for rank, host in enumerate(hosts)]
        remote: Any = ray.remote(BaseHorovodWorker)
        outcomes: list[Outcome] = []
        workers: list[Any] = [remote.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                                  resources={f"node:{host}": 0.01}).remote() for host in hosts]
        try:
            started = self._started(workers, names, hosts)
            if started is not None:
                return started
            self.nodes.update(ray.get([worker.node_id.remote() for worker in workers]))
            address, port = ray.get(workers[0].address_and_port.remote())
            cls, args, kwargs, extra = self.start_args
            elastic = {ELASTIC_EPOCH_VARIABLE: str(epoch.number), ELASTIC_STORE_VARIABLE: store,
                       ELASTIC_HOSTS_VARIABLE: epoch.hosts_argument(),
                       ELASTIC_DRIVER_VARIABLE: self.endpoint.listen(ray.util.get_node_ip_address())}
            common = {**common_variables(self.settings), **elastic}
            ray.get([worker.update_env_vars.remote({**rank_variables(where, address, port, host, common), **extra})
                     for worker, where, host in zip(workers, places, hosts)])
            pump.attach(workers)
            if cls is not None:
                outcomes = gather([worker.start_executable_supervised.remote(cls, args, kwargs) for worker in workers],
                                  names, pump)
                if any(outcome.status != "ok" for outcome in outcomes):
                    return outcomes
            outcomes = gather([worker.supervised.remote(fn) for worker in workers], names, pump)
            return outcomes
        finally:
            end_workers(workers, leave=bool(outcomes) and all(outcome.status != "failed" for outcome in outcomes))

    def _started(self, workers: Sequence[Any], names: Sequence[str], hosts: Sequence[str]) -> list[Outcome] | None:
        """None when every worker started within ``placement_group_timeout_s``; else each rank's `Outcome`
        (`start_outcomes`: a host no alive Ray node stands for by then is the one blamed)."""
        import ray

        pings = [worker.hostname.remote() for worker in workers]
        waited = self.settings.placement_group_timeout_s
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=waited)
        if len(ready) == len(pings):
            return None
        nodes, ready_ones = ray.cluster_resources(), set(ready)
        missing = {host for host in hosts if f"node:{host}" not in nodes}
        return start_outcomes([ping in ready_ones for ping in pings], names, hosts, missing, waited,
                              self.cpus_per_worker)

    def _remove_store(self, path: str) -> None:
        """Remove `path` here and on every other node that ran workers (best effort, 10 s at most)."""
        import ray

        _remove_tree(path)
        here = str(ray.get_runtime_context().get_node_id())
        others = sorted(self.nodes - {here})
        if not others:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remover = ray.remote(num_cpus=0)(_remove_tree)
        refs = [remover.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(path)
                for node in others]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=10)
        if len(ready) < len(refs):
            log.warning("could not remove the elastic store %s on %d nodes within 10 s", path, len(refs) - len(ready))
