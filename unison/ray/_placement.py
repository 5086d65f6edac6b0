"""Reserve the workers' resources in a Ray placement group and start one actor per worker in it.

Three ways, as in Horovod: ``num_workers`` packs the workers into a group of one bundle per worker
(``PACK``: as few nodes as fit); ``num_hosts`` x ``num_workers_per_host`` asks for one bundle per
host on distinct nodes (``STRICT_SPREAD``); and an executor made inside a placement group (a Ray
Tune trial, a driver actor) puts its workers in that group, unless ``use_current_placement_group``
is False. A group Ray cannot place within ``placement_group_timeout_s`` is removed again, and the
error says what was asked and what the cluster has; a current group whose bundles cannot hold every
worker is refused before any worker starts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import PlacementGroupTimeoutError
from ._worker import BaseHorovodWorker

__all__ = ["PlacementGroupTimeoutError", "Placement", "Request", "room_in", "timeout_message", "visible_devices"]

log = logging.getLogger("unison.ray")


@dataclasses.dataclass(frozen=True)
class Request:
    """What the workers need: how many, what each needs, and how they spread over nodes."""

    num_workers: int
    cpus_per_worker: float
    gpus_per_worker: float  # 0 without use_gpu
    num_hosts: int | None = None  # None: pack num_workers; else num_hosts nodes of num_workers // num_hosts

    @property
    def per_worker(self) -> dict[str, float]:
        return {name: amount for name, amount in (("CPU", self.cpus_per_worker), ("GPU", self.gpus_per_worker))
                if amount}

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: one per worker, or one per host holding its workers."""
        if self.num_hosts is None:
            return [self.per_worker for _ in range(self.num_workers)]
        per_host = self.num_workers // self.num_hosts
        return [{name: amount * per_host for name, amount in self.per_worker.items()} for _ in range(self.num_hosts)]

    @property
    def strategy(self) -> str:
        return "PACK" if self.num_hosts is None else "STRICT_SPREAD"


def timeout_message(request: Request, timeout_s: float, available: Mapping[str, float]) -> str:
    """Why the placement group did not start, with what was asked and what the cluster has free.

    Example:
        >>> print(timeout_message(Request(4, 1, 0), 5, {"CPU": 2.0, "memory": 1e9}))  # doctest: +ELLIPSIS
        Placement group creation timed out after 5 s: 4 workers need CPU 4 (bundles [{'CPU': 1}] * 4, PACK), ...
    """
    bundles = request.bundles()
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0) + amount
    needed = ", ".join(f"{name} {amount:g}" for name, amount in total.items())
    free = ", ".join(f"{name} {available.get(name, 0):g}" for name in total)
    shown = {name: amount for name, amount in bundles[0].items()} if bundles else {}
    where = "on distinct nodes, " if request.num_hosts is not None else ""
    return (f"Placement group creation timed out after {timeout_s:g} s: {request.num_workers} workers need {needed} "
            f"({where}bundles [{shown}] * {len(bundles)}, {request.strategy}), but the cluster has {free} "
            f"available (resources requested by the placement group: {bundles}; available: {dict(available)}). "
            "Make sure the cluster has enough resources (ray.init(num_cpus=...)) or use an autoscaling cluster; "
            "else ask for fewer workers or less per worker, or raise placement_group_timeout_s.")


def room_in(bundles: Sequence[Mapping[str, float]], per_worker: Mapping[str, float]) -> int:
    """How many workers of `per_worker` the `bundles` hold at most (each worker inside one bundle).

    >>> room_in([{"CPU": 1}, {"CPU": 2.5, "GPU": 1}], {"CPU": 1})
    3
    >>> room_in([{"CPU": 4}], {"CPU": 1, "GPU": 1})
    0
    """
    def fits(bundle: Mapping[str, float]) -> int:
        # 1e-9: Ray keeps resources as fixed-point decimals; 0.3 * 3 must fit in 0.9.
        counts = [math.floor(bundle.get(name, 0.0) / amount + 1e-9) for name, amount in per_worker.items() if amount]
        return min(counts) if counts else 1

    return sum(fits(bundle) for bundle in bundles)


def visible_devices(nodes: Sequence[str], gpu_ids: Sequence[Sequence[int]]) -> list[str]:
    """Each worker's ``CUDA_VISIBLE_DEVICES``: every GPU Ray gave the workers of its node, so that
    the workers of one node see each other's devices (Horovod's choice, for CUDA IPC).

    Example:
        >>> visible_devices(["a", "a", "b"], [[1], [0], [0]])
        ['0,1', '0,1', '0']
    """
    by_node: dict[str, set[int]] = {}
    for node, ids in zip(nodes, gpu_ids):
        by_node.setdefault(node, set()).update(ids)
    return [",".join(str(gpu) for gpu in sorted(by_node[node])) for node in nodes]


class Placement:
    """The placement group of a static job and the actors started in it."""

    def __init__(self, request: Request, timeout_s: float, use_current_placement_group: bool = True,
                 worker_cls: type = BaseHorovodWorker) -> None:
        self.request = request
        self.timeout_s = timeout_s
        self.use_current = use_current_placement_group
        self.worker_cls = worker_cls
        self.group: Any = None
        self.created_group = False
        self.workers: list[Any] = []

    def __repr__(self) -> str:
        return (f"<Placement {self.request.num_workers} workers, {self.request.strategy}, "
                f"{'own group' if self.created_group else 'inherited group' if self.group else 'no group'}>")

    def start(self) -> list[Any]:
        """Reserve the group (or take the current one) and start one actor per worker in it."""
        import ray
        from ray.util.placement_group import get_current_placement_group

        current = get_current_placement_group() if self.use_current else None
        if current is not None:
            log.info("Found the placement group this executor runs in: its workers go there "
                     "(use_current_placement_group=False makes a group of their own).")
            room = room_in(current.bundle_specs, self.request.per_worker)
            if room < self.request.num_workers:
                raise PlacementGroupTimeoutError(
                    f"The placement group this executor runs in has room for {room} of its "
                    f"{self.request.num_workers} workers: its bundles {current.bundle_specs} hold {room} of "
                    f"{self.request.per_worker}. Give the group a bundle per worker, or pass "
                    "use_current_placement_group=False.")
            self.group = current
        else:
            self.group = ray.util.placement_group(self.request.bundles(), strategy=self.request.strategy)
            self.created_group = True
            ready, _ = ray.wait([self.group.ready()], timeout=self.timeout_s)
            if not ready:
                available = ray.available_resources()
                self.stop()
                raise PlacementGroupTimeoutError(timeout_message(self.request, self.timeout_s, available))
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote: Any = ray.remote(self.worker_cls)
        per_host = self.request.num_workers // (self.request.num_hosts or self.request.num_workers)
        for index in range(self.request.num_workers):
            bundle = -1 if not self.created_group else index // per_host if self.request.num_hosts else index
            where = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=bundle,
                                                     placement_group_capture_child_tasks=False)
            options = remote.options(num_cpus=self.request.cpus_per_worker, num_gpus=self.request.gpus_per_worker,
                                     scheduling_strategy=where)
            self.workers.append(options.remote())
        return self.workers

    def stop(self, leave: bool = False) -> None:
        """End the actors (`leave`: after they left the job together) and remove the group if this
        placement made it (idempotent)."""
        import ray

        from ._calls import end_workers

        end_workers(self.workers, leave)
        self.workers = []
        if self.created_group and self.group is not None:
            ray.util.remove_placement_group(self.group)
        self.group, self.created_group = None, False
