"""The torch rendezvous launch: the ranks meet at a torch store and run on gloo, without MPI.

The store comes from ``init_process_group("unison", ...)`` (torch's own rendezvous made it: env://,
tcp://, file://, or the ``store=`` given; Lightning, Accelerate, ``mp.spawn`` and Ray call it so),
or, for ``hvd.init()`` alone, from torch's env:// variables (torchrun, and anything that sets
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Either way the job's keys live under
``unison/<restart>/<job>`` of the store below torch's prefixes, so a rank that reached it through
``hvd.init()`` meets one that reached it through ``init_process_group``. The start-up check runs
on the store (`unison._job.startup.check_start_in_store`); each rank's host comes with its report,
which gives the local and cross ranks; the job then runs on the gloo transport (`unison.backends.gloo`)
for both planes, or on the gRPC control plane over it with ``UNISON_CONTROLLER=grpc``.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from ...backends import create_backend
from ...backends.base import Backend
from ...config import Settings, process_environment
from ...errors import StartupError
from .. import failure as _failure
from ..startup import Arrival, check_start_in_store
from ..torch_launch import TorchLaunch, env_store, root_store
from .base import Launch, Place, Request

__all__ = ["TorchRendezvous", "place_of"]

_jobs = [0]  # jobs this process started on a torch store (every rank starts the same ones, in order)


def _restart_count() -> int:
    """torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``), 0 outside torchrun."""
    try:
        return int(process_environment().get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def place_of(rank: int, hosts: list[str]) -> Place:
    """A rank's place from every rank's host name, in rank order. Pure.

    Example:
        >>> place_of(2, ["a", "b", "a", "b"])
        Place(rank=2, size=4, local_rank=1, local_size=2, cross_rank=0, cross_size=2, homogeneous=True)
    """
    mine = hosts[rank]
    local = [r for r, host in enumerate(hosts) if host == mine]
    local_rank = local.index(rank)
    peers = [r for r in range(len(hosts)) if sum(1 for q in range(r) if hosts[q] == hosts[r]) == local_rank]
    counts = {host: hosts.count(host) for host in hosts}
    return Place(rank, len(hosts), local_rank, len(local), peers.index(rank), len(peers),
                 len(set(counts.values())) == 1)


class TorchRendezvous(Launch):
    """A job whose ranks met at a torch store: from `init_process_group`'s `Request`, or from torch's
    env:// variables (`TorchLaunch`)."""

    name = "torch"

    def __init__(self, request: Request | None = None, launch: TorchLaunch | None = None) -> None:
        if (request is None) == (launch is None):
            raise ValueError("A torch rendezvous needs a request or the env:// launch, not both.")
        self._request, self._launch = request, launch
        self._rank = request.rank if request is not None else launch.rank  # type: ignore[union-attr]
        self._size = request.size if request is not None else launch.size  # type: ignore[union-attr]
        self._arrivals: dict[int, Arrival] = {}
        self._exchanges = 0
        self.store: Any = None

    def __repr__(self) -> str:
        how = "init_process_group" if self._request is not None else "env://"
        return f"<TorchRendezvous {how} rank={self._rank} size={self._size}>"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def timeout_seconds(self, settings: Settings) -> float:
        """The start's bound: unison's start timeout, or the one given to `init_process_group` if shorter."""
        bound = settings.start_timeout_seconds
        given = self._request.timeout if self._request is not None else None
        if given is not None and given.total_seconds() > 0 and (bound <= 0 or given.total_seconds() < bound):
            return given.total_seconds()
        return bound

    def join(self, settings: Settings) -> None:
        import torch.distributed as dist

        if self._request is not None:
            root = root_store(self._request.store)
            # torchrun's agent keeps its store across restarts: a restarted rank must not meet the old keys
            restart = _restart_count()
        else:
            assert self._launch is not None
            root = env_store(self._launch, self.timeout_seconds(settings))
            restart = self._launch.restart
        # a restart under torchrun keeps the agent's store; init() after shutdown() starts a fresh job
        _jobs[0] += 1
        self.store = dist.PrefixStore(f"unison/{restart}/{_jobs[0]}", root)

    def check_start(self, problem: BaseException | None, settings: Settings) -> None:
        from .hosts import host_name

        text = f"{type(problem).__name__}: {problem}" if problem is not None else ""
        if problem is not None:
            _failure.mark_failed_start(self._rank, f"rank {self._rank} ({host_name(settings, self._rank)}, pid "
                                       f"{os.getpid()}) could not start: {text}", settings.launcher_dir,
                                       settings.launcher_relay)
        try:
            self._arrivals = check_start_in_store(self.store, self._rank, self._size, text,
                                                  self.timeout_seconds(settings), socket.gethostname())
        except StartupError:
            if problem is not None:
                raise problem from None
            raise
        if problem is not None:
            raise problem

    def place(self) -> Place:
        return place_of(self._rank, [self._arrivals[r].host for r in range(self._size)])

    def exchange(self, payload: bytes) -> list[bytes]:
        """Every rank's payload through the store (before any gloo group exists, so that ranks that
        disagree on the transport are told before they try to build one)."""
        self._exchanges += 1
        keys = [f"exchange/{self._exchanges}/{r}" for r in range(self._size)]
        self.store.set(keys[self._rank], payload)
        deadline = time.monotonic() + 60.0
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                raise StartupError(f"init() failed: ranks {[r for r, k in enumerate(keys) if not self.store.check([k])]} "
                                   "did not reach the settings agreement within 60 s.", ())
            time.sleep(0.005)
        return [bytes(self.store.get(key)) for key in keys]

    def connect(self, settings: Settings, place: Place) -> Backend:
        from ...backends.gloo import GlooWorld

        world = GlooWorld(self.store, self._rank, self._size, peer_timeout_seconds=settings.peer_timeout_seconds)
        data = create_backend("gloo", world, settings)
        if settings.controller != "grpc":
            return data
        from ...service.setup import grpc_over  # UNISON_CONTROLLER=grpc: the coordinator service on rank 0

        return grpc_over(data, settings, place.local_size)
