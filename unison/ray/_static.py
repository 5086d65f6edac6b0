"""A fixed number of workers on Ray: place them, hand each its rank, run calls on them, name every rank that fails.

`start` reserves the workers' resources (`_placement`), numbers the workers by node (`_layout.place`),
asks rank 0's worker for its address and a free port there, and sets in each worker's environment
torch's ``env://`` variables, with which ``hvd.init()`` (or ``init_process_group("unison")``) meets
the other ranks through torch's store on the gloo transport: no MPI, no ssh. A call that fails on
some rank raises `LaunchError` on the driver naming every rank that failed (rank, host, pid,
exception, the user's line), and ends the workers: a unison job whose rank failed stops on every
rank, so the executor must be started again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import LaunchError, NotInitializedError
from ._calls import Callbacks, calling, gather
from ._layout import place, rank_variables
from ._outcomes import failure_message
from ._placement import Placement, PlacementGroupTimeoutError, Request, visible_devices
from ._settings import MiniSettings
from ._worker import Outcome

__all__ = ["ExecutorState", "StaticAdapter", "common_variables"]


class ExecutorState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    FAILED = "failed"  # a call failed: the workers were ended
    SHUT_DOWN = "shut down"


def common_variables(settings: MiniSettings) -> dict[str, str]:
    """What every worker of a job gets from the settings: unison's start timeout, the gloo interfaces.

    Example:
        >>> common_variables(MiniSettings(timeout_s=30, nics={"eth1", "eth0"}))
        {'UNISON_START_TIMEOUT_SECONDS': '30', 'GLOO_SOCKET_IFNAME': 'eth0,eth1'}
    """
    env = {"UNISON_START_TIMEOUT_SECONDS": f"{settings.timeout_s:g}"}
    if settings.nics:
        env["GLOO_SOCKET_IFNAME"] = ",".join(sorted(settings.nics))
    return env


class StaticAdapter:
    """The workers of a non-elastic `RayExecutor`, and the calls run on them."""

    def __init__(self, settings: MiniSettings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True) -> None:
        self.settings = settings
        workers = num_workers if num_workers is not None else (num_hosts or 0) * num_workers_per_host
        gpus = (gpus_per_worker or 1) if use_gpu else 0
        self.request = Request(workers, cpus_per_worker, gpus, None if num_workers is not None else num_hosts)
        self.use_gpu = use_gpu
        self.placement = Placement(self.request, settings.placement_group_timeout_s, use_current_placement_group)
        self.workers: list[Any] = []  # in rank order
        self.names: list[str] = []  # "rank R (host)", for messages about a worker that died
        self.state = ExecutorState.NEW
        self.calls = 0
        self.failed_calls = 0

    def __repr__(self) -> str:
        return f"<StaticAdapter {self.state.value}, {self.request.num_workers} workers, {self.placement!r}>"

    def statistics(self) -> dict[str, int]:
        return {"workers": len(self.workers), "calls": self.calls, "failed_calls": self.failed_calls}

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, Any] | None = None) -> None:
        """Start the workers, hand each its place in the job, and build their executable objects."""
        import ray

        if self.state is ExecutorState.RUNNING:
            raise LaunchError("RayExecutor.start() was called twice: its workers already run. Call shutdown() "
                              "first to start them again.")
        created = self.placement.start()
        try:
            self._wait_started(created)
            nodes = ray.get([worker.node_id.remote() for worker in created])
            hosts = ray.get([worker.hostname.remote() for worker in created])
            places = place(nodes)
            order = sorted(range(len(created)), key=lambda index: places[index].rank)
            self.workers = [created[index] for index in order]
            self.names = [f"rank {places[index].rank} ({hosts[index]})" for index in order]
            extra = common_variables(self.settings)
            if self.use_gpu:
                gpu_ids = ray.get([worker.get_gpu_ids.remote() for worker in self.workers])
                devices = visible_devices([places[index].node for index in order], gpu_ids)
            address, port = ray.get(self.workers[0].address_and_port.remote())
            envs = []
            for rank, index in enumerate(order):
                env = rank_variables(places[index], address, port, hosts[index], extra)
                if self.use_gpu:
                    env["CUDA_VISIBLE_DEVICES"] = devices[rank]
                env.update({name: str(value) for name, value in (extra_env_vars or {}).items()})
                envs.append(env)
            ray.get([worker.update_env_vars.remote(env) for worker, env in zip(self.workers, envs)])
            self.state = ExecutorState.RUNNING
            if executable_cls is not None:
                args, kwargs = list(executable_args or []), dict(executable_kwargs or {})
                self._finish("RayExecutor.start", [worker.start_executable_supervised.remote(executable_cls, args, kwargs)
                                                   for worker in self.workers])
        except BaseException:
            self._end(ExecutorState.FAILED)
            raise

    def _wait_started(self, workers: Sequence[Any]) -> None:
        """Return once every worker answers; raise when some did not start within the placement timeout
        (slow to start, or in a placement group the executor did not make whose room others hold)."""
        import ray

        pings = [worker.hostname.remote() for worker in workers]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=self.placement.timeout_s)
        if len(ready) < len(pings):
            if self.placement.created_group:
                where = "their placement group: it is reserved for them, so they start slowly"
                advice = "Raise placement_group_timeout_s."
            else:
                where = ("the placement group this executor runs in: its bundles are large enough, so other "
                         "tasks (the driver or trainable itself among them) hold their room, or they start slowly")
                advice = "Raise placement_group_timeout_s, or give the group room for the workers beside its other tasks."
            raise PlacementGroupTimeoutError(
                f"{len(pings) - len(ready)} of {len(pings)} workers did not start within "
                f"{self.placement.timeout_s:g} s (placement_group_timeout_s) in {where}. {advice}")

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(executable)`` on every worker; the values in rank order."""
        return self._call("RayExecutor.execute", fn, self._running("execute"), callbacks)

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; the values in rank order."""
        return self._call("RayExecutor.run", calling(fn, args, kwargs), self._running("run"), callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; Ray object refs of the values, in rank order."""
        workers = self._running("run_remote")
        self.calls += 1
        return [worker.execute.remote(calling(fn, args, kwargs)) for worker in workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0's worker; its value."""
        return self._call("RayExecutor.execute_single", fn, self._running("execute_single")[:1], None)[0]

    def shutdown(self) -> None:
        """End the workers and give back their resources (idempotent)."""
        self._end(ExecutorState.SHUT_DOWN)

    def _running(self, method: str) -> list[Any]:
        if self.state is ExecutorState.RUNNING:
            return self.workers
        why = {ExecutorState.NEW: "was called before start()",
               ExecutorState.FAILED: "was called after a call failed, which ended the workers",
               ExecutorState.SHUT_DOWN: "was called after shutdown()"}[self.state]
        raise NotInitializedError(f"RayExecutor.{method}() {why}. Call start() first.")

    def _call(self, what: str, fn: Callable[[Any], Any], workers: Sequence[Any],
              callbacks: Sequence[Callable[[Any], object]] | None) -> list[Any]:
        self.calls += 1
        pump = Callbacks(callbacks)
        try:
            pump.attach(workers)
            refs = [worker.supervised.remote(fn) for worker in workers]
            return self._finish(what, refs, pump)
        finally:
            pump.close()

    def _finish(self, what: str, refs: Sequence[Any], pump: Callbacks | None = None) -> list[Any]:
        outcomes = gather(refs, self.names[:len(refs)], pump)
        if all(outcome.status == "ok" for outcome in outcomes):
            return [outcome.value for outcome in outcomes]
        self.failed_calls += 1
        self._end(ExecutorState.FAILED)
        raise _failure(what, outcomes)

    def _end(self, state: ExecutorState) -> None:
        self.placement.stop(leave=state is ExecutorState.SHUT_DOWN and self.state is ExecutorState.RUNNING)
        self.workers = []
        self.state = state


def _failure(what: str, outcomes: Sequence[Outcome]) -> LaunchError:
    """The driver's error for a failed call, caused by the first failing rank's own exception when it travelled."""
    error = LaunchError(failure_message(what, outcomes, "The executor's workers were ended; call start() to run "
                                        "again."))
    first = next((outcome.error for outcome in sorted(outcomes, key=lambda o: not o.cause)
                  if outcome.status == "failed" and outcome.error is not None), None)
    error.__cause__ = first
    return error
