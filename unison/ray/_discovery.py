"""Find an elastic job's hosts: Ray's alive nodes and how many workers each can hold, or a discovery object's answer.

`RayHostDiscovery` is Horovod's: each alive node of the cluster is a host named by its address, with
as many slots as its CPUs (and, with GPUs, its GPUs) hold workers. Any object with Horovod's
``find_available_hosts_and_slots() -> {host: slots}`` can stand in for it (``settings.discovery``
with ``override_discovery=False``); its host names must then be Ray resources (``node:<host>``),
which is how the workers are pinned to their host.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..elastic.membership import Host

__all__ = ["DiscoveryPoller", "RayHostDiscovery", "slots_of"]

log = logging.getLogger("unison.ray")


def slots_of(nodes: Iterable[Mapping[str, Any]], cpus_per_worker: float = 1, use_gpu: bool = False,
             gpus_per_worker: float = 1) -> dict[str, int]:
    """Each alive node's address and the workers its resources hold (nodes as ``ray.nodes()`` lists them).

    Example:
        >>> node = {"alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0, "GPU": 2.0}}
        >>> slots_of([node], cpus_per_worker=1), slots_of([node], use_gpu=True)
        ({'10.0.0.2': 8}, {'10.0.0.2': 2})
    """
    hosts: dict[str, int] = {}
    for node in nodes:
        if not node.get("alive"):
            continue
        resources = node.get("Resources", {})
        slots = resources.get("CPU", 0) // cpus_per_worker
        if use_gpu:
            slots = min(slots, resources.get("GPU", 0) // gpus_per_worker)
        if int(math.ceil(slots)) > 0:
            hosts[str(node["NodeManagerAddress"])] = int(math.ceil(slots))
    return hosts


class RayHostDiscovery:
    """The cluster's alive nodes as hosts (Horovod's ``RayHostDiscovery``)."""

    def __init__(self, use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: float = 1) -> None:
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker

    def __repr__(self) -> str:
        return (f"RayHostDiscovery(use_gpu={self.use_gpu}, cpus_per_worker={self.cpus_per_worker}, "
                f"gpus_per_worker={self.gpus_per_worker})")

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{host address: slots}`` of the cluster's alive nodes."""
        import ray

        return slots_of(ray.nodes(), self.cpus_per_worker, self.use_gpu, self.gpus_per_worker)


class DiscoveryPoller:
    """Asks a discovery object for the hosts every `interval_s` in a thread and keeps the last good answer."""

    def __init__(self, discovery: Any, interval_s: float, on_hosts: Callable[[tuple[Host, ...]], None]) -> None:
        self.discovery = discovery
        self.interval_s = interval_s
        self.on_hosts = on_hosts
        self.hosts: tuple[Host, ...] = ()
        self.polls = 0
        self.error = ""
        self.changed = threading.Event()
        self._stop = threading.Event()
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="unison-ray-discovery", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<DiscoveryPoller {self.discovery!r} every {self.interval_s:g} s, polls={self.polls}>"

    def statistics(self) -> dict[str, int]:
        return {"polls": self.polls}

    def poll(self) -> None:
        try:
            found = self.discovery.find_available_hosts_and_slots()
            hosts = tuple(Host(str(name), int(slots)) for name, slots in dict(found).items() if int(slots) > 0)
        except Exception as exc:  # noqa: BLE001  (a discovery that fails keeps the hosts it gave last)
            if str(exc) != self.error:
                log.warning("host discovery failed: %s: %s (keeping the hosts it gave last)", type(exc).__name__, exc)
            self.error = str(exc)
            return
        self.error = ""
        self.polls += 1
        if hosts != self.hosts:
            self.hosts = hosts
            self.changed.set()
        self.on_hosts(hosts)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
