"""``RayExecutor``: Horovod's job class for Ray, with its signature, over a static or an elastic set of workers.

The executor checks its arguments, then hands every call to an adapter: `StaticAdapter` for
``num_workers`` or ``num_hosts``, `ElasticAdapter` for ``min_workers``. When this process is a Ray
client (``ray.init("ray://...")``) the adapter runs as an actor inside the cluster, as in Horovod,
so that the workers' rendezvous never crosses the client's link.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgumentError, MissingDependencyError
from ._settings import MiniSettings, check_seconds

__all__ = ["RayExecutor"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("unison.ray runs its workers on Ray, which is not installed: "
                                     "pip install 'ray[default]' (or 'ray[train]').") from None
    return ray


class RayExecutor:
    """Run a unison job on a Ray cluster (Horovod's ``horovod.ray.RayExecutor``).

    Args:
        settings: `create_settings`'s result.
        num_workers: how many workers (ranks), packed onto as few nodes as fit.
        num_hosts: instead of `num_workers`: how many nodes, each running `num_workers_per_host` workers.
        num_workers_per_host: workers per node with `num_hosts`.
        cpus_per_worker: CPUs Ray reserves for each worker.
        use_gpu: reserve GPUs; each worker sees every GPU of its node's workers (``CUDA_VISIBLE_DEVICES``).
        gpus_per_worker: GPUs per worker with `use_gpu` (default 1).
        use_current_placement_group: put the workers in the placement group this executor runs in, if any.
        min_workers: makes the job elastic: the fewest workers to train with.
        max_workers: elastic: the most workers (default: every slot discovery offers).
        reset_limit: elastic: stop after this many resets.
        cooldown_range: elastic: ``(low, high)`` seconds a failed host stays out, backing off.
        elastic_timeout: elastic: seconds to wait for `min_workers` slots.
        override_discovery: elastic: discover hosts from Ray's nodes (False: ``settings.discovery``).

    Example:
        >>> settings = RayExecutor.create_settings(timeout_s=30)           # doctest: +SKIP
        >>> executor = RayExecutor(settings, num_workers=4)                # doctest: +SKIP
        >>> executor.start()                                               # doctest: +SKIP
        >>> executor.run(train, kwargs={"epochs": 3})                      # doctest: +SKIP
        >>> executor.shutdown()                                            # doctest: +SKIP
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: float = 100, nics: set[str] | None = None) -> MiniSettings:
        """The settings of a job: how long the workers wait for each other when they join it
        (`timeout_s`), how long to wait for Ray to reserve their resources (`placement_group_timeout_s`),
        and the network interfaces their transport may use (`nics`). The ssh arguments are Horovod's and
        unused (the workers are Ray actors)."""
        return MiniSettings(ssh_identity_file=ssh_identity_file, timeout_s=check_seconds("timeout_s", timeout_s),
                            placement_group_timeout_s=check_seconds("placement_group_timeout_s",
                                                                    placement_group_timeout_s),
                            nics=set(nics) if nics else None)

    def __init__(self, settings: MiniSettings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int | None = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: Sequence[float] | None = None, elastic_timeout: float = 600,
                 override_discovery: bool = True) -> None:
        num_workers_per_host = 1 if num_workers_per_host is None else num_workers_per_host  # None: Horovod's tests
        _check(num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu, gpus_per_worker,
               min_workers, max_workers)
        self.settings = settings
        self.params: dict[str, Any] = dict(cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                                           gpus_per_worker=gpus_per_worker)
        if min_workers is not None:
            self.params.update(min_workers=min_workers, max_workers=max_workers, reset_limit=reset_limit,
                               cooldown_range=tuple(cooldown_range) if cooldown_range is not None else None,
                               elastic_timeout=check_seconds("elastic_timeout", elastic_timeout),
                               override_discovery=override_discovery)
        else:
            self.params.update(num_workers=num_workers, num_hosts=num_hosts, num_workers_per_host=num_workers_per_host,
                               use_current_placement_group=use_current_placement_group)
        settings.elastic = min_workers is not None
        self.adapter: Any = None
        self._is_remote = False
        self._shut_down = False  # shutdown() ended the workers of a start (a later start() starts anew)

    def __repr__(self) -> str:
        kind = "elastic" if self.settings.elastic else "static"
        return f"<RayExecutor {kind}, adapter={self.adapter!r}{' (remote)' if self._is_remote else ''}>"

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, Any] | None = None) -> None:
        """Start the workers and build on each ``executable_cls(*executable_args, **executable_kwargs)``,
        the object `execute`'s functions receive; `extra_env_vars` are set in every worker first.
        Starting again ends the workers of the previous start."""
        ray = _ray()
        self.shutdown()
        if self.settings.elastic:
            from ._elastic import ElasticAdapter as adapter_cls
        else:
            from ._static import StaticAdapter as adapter_cls  # type: ignore[assignment]
        self._is_remote = bool(ray.util.client.ray.is_connected())
        if self._is_remote:
            self.adapter = ray.remote(num_cpus=0)(adapter_cls).remote(self.settings, **self.params)
        else:
            self.adapter = adapter_cls(self.settings, **self.params)
        self._shut_down = False
        self._call("start", executable_cls=executable_cls, executable_args=executable_args,
                   executable_kwargs=executable_kwargs, extra_env_vars=extra_env_vars)

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(executable)`` on every worker; the values in rank order. Each value ``ray_logger.log``
        sends goes to every callback."""
        return self._call("execute", fn=fn, callbacks=callbacks)  # type: ignore[no-any-return]

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: Sequence[Callable[[Any], object]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; the values in rank order.

        Raises:
            LaunchError: some rank failed; the message names each one (rank, host, pid, exception,
                line), the program's failure first, and the workers are ended.
        """
        return self._call("run", fn=fn, args=args, kwargs=kwargs, callbacks=callbacks)  # type: ignore[no-any-return]

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; a Ray object ref per rank, in rank order (``ray.get`` them)."""
        return self._call("run_remote", fn=fn, args=args, kwargs=kwargs)  # type: ignore[no-any-return]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0's worker alone; its value."""
        return self._call("execute_single", fn=fn)

    def statistics(self) -> dict[str, int]:
        """The adapter's counters: workers and calls (static), or epochs, resets and runs (elastic)."""
        return dict(self._call("statistics")) if self.adapter is not None else {}

    def shutdown(self) -> None:
        """End the workers and give back their resources."""
        if self.adapter is not None:
            self._call("shutdown")
            self.adapter = None
            self._shut_down = True

    def _call(self, method: str, **kwargs: Any) -> Any:
        if self.adapter is None:
            from ..errors import NotInitializedError

            if self._shut_down:
                raise NotInitializedError(f"RayExecutor.{method}() was called after shutdown(), which ended the "
                                          f"workers. Call start() to start them again.")
            raise NotInitializedError(f"RayExecutor.{method}() was called before start(). Call start() first.")
        if self._is_remote:
            return _ray().get(getattr(self.adapter, method).remote(**kwargs))
        return getattr(self.adapter, method)(**kwargs)


def _check(num_workers: int | None, num_hosts: int | None, num_workers_per_host: int, cpus_per_worker: float,
           use_gpu: bool, gpus_per_worker: float | None, min_workers: int | None, max_workers: int | None) -> None:
    """Refuse arguments that cannot make a job, before anything starts."""
    if max_workers is not None and (min_workers is None or min_workers <= 0):
        raise InvalidArgumentError(f"`max_workers` provided without any positive `min_workers`: an elastic job needs "
                                   f"min_workers >= 1. Got min_workers={min_workers}, max_workers={max_workers}.")
    if min_workers is not None and num_workers is not None:
        raise InvalidArgumentError(f"Both `min_workers` and `num_workers` provided. Only one of the above is allowed "
                                   f"as a job is either elastic (min_workers) or not (num_workers). Got "
                                   f"min_workers={min_workers}, num_workers={num_workers}.")
    if min_workers is not None:
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise InvalidArgumentError(f"An elastic job needs 1 <= min_workers <= max_workers. Got "
                                       f"min_workers={min_workers}, max_workers={max_workers}.")
    elif num_workers is not None and num_hosts is not None:
        raise InvalidArgumentError(f"Give num_workers, or num_hosts with num_workers_per_host, not both. Got "
                                   f"num_workers={num_workers}, num_hosts={num_hosts}.")
    elif num_workers is None and num_hosts is None:
        raise InvalidArgumentError("A RayExecutor needs num_workers=N, num_hosts=H with num_workers_per_host=K, or "
                                   "(elastic) min_workers=M. Got none of them.")
    elif (num_workers is not None and num_workers < 1) or (num_hosts is not None and num_hosts < 1) \
            or num_workers_per_host < 1:
        raise InvalidArgumentError(f"num_workers, num_hosts and num_workers_per_host must be at least 1. Got "
                                   f"num_workers={num_workers}, num_hosts={num_hosts}, "
                                   f"num_workers_per_host={num_workers_per_host}.")
    if not cpus_per_worker or cpus_per_worker < 0:
        raise InvalidArgumentError(f"cpus_per_worker must be positive. Got cpus_per_worker={cpus_per_worker}.")
    if gpus_per_worker and not use_gpu:
        raise InvalidArgumentError(f"gpus_per_worker is set, but use_gpu is False. use_gpu must be True if "
                                   f"gpus_per_worker is set. Got gpus_per_worker={gpus_per_worker}.")
    if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1 and isinstance(gpus_per_worker, int):
        raise InvalidArgumentError(f"gpus_per_worker must be >= 1. Got {gpus_per_worker}.")
