"""A job launched by torch's launcher (torchrun, or anything that sets torch's env:// variables), without MPI.

torchrun starts each process with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``, and hosts a store there (its agent's). `init()` then meets the
other ranks through that store (torch's own ``env://`` rendezvous) and runs the job on the gloo
transport (`unison.backends.gloo`) for both planes: no mpiexec, no mpi4py. Keys live under a prefix
of the launch's restart count, so that a restart (``torchrun --max-restarts``) starts a fresh job
on the store the agent keeps.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import numpy as np

from ..config import Settings, process_environment
from ..errors import ConfigError, MissingDependencyError

__all__ = ["TorchLaunch", "check_settings_agree", "torch_backend", "torch_launch", "torch_launched_alone"]

_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MPI_LAUNCHERS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_RANK")
_jobs = [0]  # jobs this process started on torch's store (every rank starts the same ones, in order)


@dataclasses.dataclass(frozen=True)
class TorchLaunch:
    """This process's place in a torch-launched job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    restart: int

    @property
    def topology(self) -> tuple[int, int, int, int, bool]:
        """(local rank, local size, cross rank, cross size, homogeneous), as `unison._job.runtime` keeps it."""
        hosts = max(1, self.size // max(1, self.local_size))
        return self.local_rank, self.local_size, self.rank // max(1, self.local_size), hosts, \
            self.size % max(1, self.local_size) == 0


def torch_launch(env: Mapping[str, str] | None = None) -> TorchLaunch | None:
    """The launch when torch's env:// variables describe a job of several processes and no MPI
    launcher started this one; else None.

    Example:
        >>> torch_launch({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).rank
        1
        >>> torch_launch({"RANK": "0", "WORLD_SIZE": "2", "PMI_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    """
    env = process_environment() if env is None else env
    if any(name not in env for name in _VARIABLES) or any(name in env for name in _MPI_LAUNCHERS):
        return None
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_size = int(env.get("LOCAL_WORLD_SIZE", str(size)))
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError as exc:
        raise ConfigError(f"torch's launch variables must be integers: {exc}. Got RANK={env.get('RANK')!r}, "
                          f"WORLD_SIZE={env.get('WORLD_SIZE')!r}, LOCAL_RANK={env.get('LOCAL_RANK')!r}.") from None
    if size <= 1:
        return None
    if not 0 <= rank < size:
        raise ConfigError(f"RANK must be in range(WORLD_SIZE={size}). Got RANK={rank}.")
    return TorchLaunch(rank, size, local_rank, local_size, restart)


def torch_launched_alone(env: Mapping[str, str] | None = None) -> bool:
    """Whether torch's env:// variables describe a job of this one process (``torchrun --nproc-per-node 1``)
    and no MPI launcher started it: `init()` then makes a job of one without starting MPI.

    Example:
        >>> torch_launched_alone({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
        True
        >>> torch_launched_alone({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1", "PMI_SIZE": "1"})
        False
    """
    env = process_environment() if env is None else env
    return (all(name in env for name in _VARIABLES) and not any(name in env for name in _MPI_LAUNCHERS)
            and env["WORLD_SIZE"].strip() == "1")


def torch_backend(launch: TorchLaunch, settings: Settings) -> Any:
    """Meet the other ranks through torch's store and return the gloo transport over them (under the
    gRPC coordinator service with ``UNISON_CONTROLLER=grpc``)."""
    try:
        import torch.distributed as dist
    except ImportError:
        raise MissingDependencyError(
            "This process was started by torchrun (torch's env:// variables are set, no MPI launcher), which "
            "needs torch: pip install torch."
        ) from None
    from ..backends import create_backend
    from ..backends.gloo import GlooWorld

    timeout = timedelta(seconds=settings.start_timeout_seconds or 1800.0)
    store, rank, size = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.size, timeout=timeout))
    _jobs[0] += 1  # init() after shutdown() starts a fresh job: keys of its own, as a restart's
    world = GlooWorld(dist.PrefixStore(f"unison/{launch.restart}/{_jobs[0]}", store), rank, size,
                      peer_timeout_seconds=settings.peer_timeout_seconds)
    data = create_backend("gloo", world, settings)
    if settings.controller != "grpc":
        return data
    from ..service.setup import grpc_over  # UNISON_CONTROLLER=grpc: the coordinator service on rank 0

    return grpc_over(data, settings, launch.local_size)


def check_settings_agree(backend: Any, settings: Settings) -> None:
    """Collective: refuse, on every rank, to start when the ranks differ in a job-wide setting."""
    from ..config import disagreement, job_wide_values

    mine = np.frombuffer(json.dumps(job_wide_values(settings), sort_keys=True).encode(), dtype=np.uint8)
    lengths = [int(row[0]) for row in backend.allgather_status(np.array([mine.size], dtype=np.uint64))]
    gathered = np.empty(sum(lengths), dtype=np.uint8)
    backend.allgatherv(mine.copy(), gathered, lengths, 0)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(int)
    problem = disagreement([json.loads(gathered[offsets[r]:offsets[r + 1]].tobytes()) for r in range(len(lengths))])
    if problem:
        raise ConfigError(problem)
