"""The one interface of a launch: how a process learns its place in a job and reaches the others.

A launch is found by `unison._job.launch.detect` and driven by `init()` in one order: `join` (reach
the other processes: start MPI, meet at a torch store), `check_start` (every rank arrived and its local
set-up worked, or every rank raises, naming who did not), `place` (rank, size, local and cross ranks),
`exchange` (an allgather of bytes, for the settings agreement), `connect` (the `Backend` the engine
runs on). Each launch is a plug-in of its own module: `mpi` (unisonrun, mpiexec, srun), `rendezvous`
(torch's stores: torchrun, env://, tcp://, file://, a store given to ``init_process_group``), `single`.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

from ...backends.base import Backend
from ...config import Settings, disagreement, job_wide_values
from ...errors import ConfigError

__all__ = ["Launch", "Place", "Request", "agree_settings"]


@dataclasses.dataclass(frozen=True)
class Place:
    """A process's place in the job: its rank, the job's size, and where it sits among the hosts."""

    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    homogeneous: bool = True

    @classmethod
    def of_blocks(cls, rank: int, size: int, local_rank: int, local_size: int) -> Place:
        """The place of a rank in a job laid out in blocks of `local_size` ranks per host (torch's launchers).

        Example:
            >>> Place.of_blocks(3, 4, 1, 2)
            Place(rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2, homogeneous=True)
        """
        per_host = max(1, local_size)
        return cls(rank, size, local_rank, local_size, rank // per_host, max(1, size // per_host),
                   size % per_host == 0)


@dataclasses.dataclass(frozen=True)
class Request:
    """What ``init_process_group("unison", ...)`` hands the backend's factory: torch's store for the
    group (after torch's own rendezvous: env://, tcp://, file:// or ``store=``), this rank, the world
    size and the timeout."""

    store: Any  # a torch Store
    rank: int
    size: int
    timeout: timedelta | None = None


class Launch(abc.ABC):
    """One way a process becomes a rank of a unison job; see the module docstring for the order."""

    name = ""
    mpi: ModuleType | None = None  # the mpi4py MPI module, for a launch over MPI
    comm: Any = None  # the job's communicator, for a launch over MPI (the failure handling's exit agreement)
    store: Any = None  # the torch store the ranks met at, for a launch over one

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @abc.abstractmethod
    def join(self, settings: Settings) -> None:
        """Reach the other processes of the launch (may raise before any of them is told)."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank, known once joined."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """The job's number of processes, known once joined."""

    @abc.abstractmethod
    def check_start(self, problem: BaseException | None, settings: Settings) -> None:
        """Bounded and collective: return when every rank arrived and reported no problem; else raise,
        on every rank that can be told, naming the ranks that did not arrive or could not start."""

    @abc.abstractmethod
    def place(self) -> Place:
        """This rank's place (collective where the launch must ask the others)."""

    @abc.abstractmethod
    def exchange(self, payload: bytes) -> list[bytes]:
        """Collective: every rank's `payload`, in rank order."""

    @abc.abstractmethod
    def connect(self, settings: Settings, place: Place) -> Backend:
        """Collective: the transport the engine runs on."""


def agree_settings(exchange: Callable[[bytes], list[bytes]], settings: Settings) -> None:
    """Collective: refuse, on every rank, to start a job whose ranks differ in a job-wide setting
    (it would hang or mix up buffers later). One routine for every launch: `exchange` is its allgather.

    Example:
        >>> agree_settings(lambda payload: [payload, payload], Settings())
    """
    rows = [json.loads(row) for row in exchange(json.dumps(job_wide_values(settings), sort_keys=True).encode())]
    problem = disagreement(rows)
    if problem:
        raise ConfigError(problem)
