"""The MPI launch: processes started by unisonrun, mpiexec or srun (or a communicator given to `init`).

`join` starts MPI under the start-up watchdog (`unison._job.startup.guard_mpi_start`), starting it
where the application kept mpi4py from doing so (and finalizing it at exit then), and resolves the
job's communicator; `check_start` is the point-to-point start-up check; `place` splits the
communicator by host; `connect` makes the MPI transport (or the gRPC control plane over it).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import numpy as np

from ...backends import create_backend
from ...backends.base import Backend
from ...config import Settings, process_environment
from ...errors import ConfigError, InvalidArgumentError, StartupError
from .. import failure as _failure
from .base import Launch, Place
from .hosts import host_name

__all__ = ["MpiLaunch", "launcher_size", "started_by_mpi"]

_MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_finalize_registered = [False]


def launcher_size(env: Mapping[str, str] | None = None) -> int:
    """The number of processes an MPI launcher (or srun) started, 1 when none did.

    SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: the latter is also set for a plain ``python x.py`` inside
    an ``sbatch --ntasks=4`` script, which is a job of one process.

    Example:
        >>> launcher_size({"PMI_SIZE": "4"}), launcher_size({"SLURM_NTASKS": "4"})
        (4, 1)
    """
    env = process_environment() if env is None else env
    for key in (*_MPI_SIZES, "SLURM_STEP_NUM_TASKS"):
        if key in env:
            try:
                return int(env[key])
            except ValueError:
                continue
    return 1


def started_by_mpi(env: Mapping[str, str] | None = None, srun_too: bool = True) -> bool:
    """Whether an MPI launcher started this process as one of several (srun's step counts unless
    `srun_too` is False: a store handed to ``init_process_group`` then wins over srun's variables).

    Example:
        >>> started_by_mpi({"SLURM_STEP_NUM_TASKS": "2"}), started_by_mpi({"SLURM_STEP_NUM_TASKS": "2"}, srun_too=False)
        (True, False)
    """
    env = process_environment() if env is None else env
    if srun_too:
        return launcher_size(env) > 1
    return any(key in env and env[key].strip() not in ("", "1") for key in _MPI_SIZES)


class MpiLaunch(Launch):
    """A job over MPI: every process of the launch, or the ranks of a communicator given to `init`."""

    name = "mpi"

    def __init__(self, comm: Any = None, finalize_first: Callable[[], None] = lambda: None) -> None:
        self._given = comm
        self._finalize_first = finalize_first  # at exit, before MPI_Finalize: the job's own shutdown
        self.mpi: ModuleType | None = None
        self.comm: Any = None

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    def join(self, settings: Settings) -> None:
        from ...backends.mpi import import_mpi
        from ..startup import guard_mpi_start

        if settings.mpi_threads_disable:
            import mpi4py

            mpi4py.rc.thread_level = "serialized"
        launched = launcher_size()
        with guard_mpi_start(settings.start_timeout_seconds, launched):
            mpi = self.mpi = import_mpi()
            self._start_mpi(settings.mpi_threads_disable)
        self.comm = _resolve_comm(mpi, self._given)
        if self._given is None and launched > 1 and self.comm.Get_size() == 1:
            raise ConfigError(
                f"The launcher started {launched} processes, but MPI sees each as a job of size 1: "
                "the mpiexec used belongs to a different MPI library than the one mpi4py loaded "
                f"({mpi.Get_library_version().splitlines()[0].strip()}). Launch with the mpiexec "
                "of that library (with the mpich wheel: the mpiexec in the same environment's bin/)."
            )

    def _start_mpi(self, serialized: bool) -> None:
        """Start MPI if the application kept mpi4py from it, and finalize it at exit if so (once)."""
        from ...backends.mpi import initialize_mpi

        mpi = self.mpi
        assert mpi is not None
        if initialize_mpi(mpi, serialized) and not _finalize_registered[0]:
            _finalize_registered[0] = True
            # Registered before the job's own shutdown (at the end of the first init()), so it runs after it.
            atexit.register(_finalize_mpi, mpi, self._finalize_first)

    def check_start(self, problem: BaseException | None, settings: Settings) -> None:
        from ..startup import check_start

        text = ""
        rank = self.rank
        assert self.mpi is not None
        if problem is not None:
            text = f"{type(problem).__name__}: {problem}"
            # Before the others hear of it (and exit, as its consequence): the launcher names this rank.
            _failure.mark_failed_start(rank, f"rank {rank} ({host_name(settings, rank)}, pid {os.getpid()}) could "
                                       f"not start: {text}", settings.launcher_dir, settings.launcher_relay)
        try:
            check_start(self.comm, self.mpi, text, settings.start_timeout_seconds)
        except StartupError as exc:
            if exc.missing_ranks:  # a rank never arrived: this process must not wait for it at exit either
                _failure.job_broken(str(exc), self.comm)
            if problem is not None:
                raise problem from None
            raise
        if problem is not None:  # a job of one process: nobody else to tell
            raise problem

    def place(self) -> Place:
        mpi, comm = self.mpi, self.comm
        assert mpi is not None
        local = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
        local_rank, local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(local_rank, key=comm.Get_rank())
        cross_rank, cross_size = cross.Get_rank(), cross.Get_size()
        sizes = comm.allgather(local_size)
        local.Free()
        cross.Free()
        return Place(comm.Get_rank(), comm.Get_size(), local_rank, local_size, cross_rank, cross_size,
                     len(set(sizes)) == 1)

    def exchange(self, payload: bytes) -> list[bytes]:
        comm = self.comm
        if comm.Get_size() == 1:
            return [payload]
        mine = np.frombuffer(payload, dtype=np.uint8)
        lengths = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([mine.size], dtype=np.int64), lengths)
        displs = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(int).tolist()
        gathered = np.empty(int(lengths.sum()), dtype=np.uint8)
        comm.Allgatherv(mine, [gathered, (lengths.astype(int).tolist(), displs)])
        return [gathered[d : d + n].tobytes() for d, n in zip(displs, lengths.tolist())]

    def connect(self, settings: Settings, place: Place) -> Backend:
        return create_backend(settings.controller, self.comm, settings, local_size=place.local_size)


def _resolve_comm(mpi: Any, comm: Any) -> Any:
    world = mpi.COMM_WORLD
    if comm is None:
        return world
    if hasattr(comm, "Get_rank"):
        return comm
    ranks = sorted(int(r) for r in comm)
    bad = [r for r in ranks if not 0 <= r < world.Get_size()]
    if bad or not ranks:
        raise InvalidArgumentError(
            f"init(comm=[...]) needs world ranks in range({world.Get_size()}). Got {list(comm)}."
        )
    member = world.Get_rank() in ranks
    sub = world.Split(0 if member else mpi.UNDEFINED, key=world.Get_rank())
    if not member:
        raise InvalidArgumentError(
            f"This process (world rank {world.Get_rank()}) is not in init(comm={ranks}); only the "
            "listed ranks may call init()."
        )
    return sub


def _finalize_mpi(mpi: ModuleType, finalize_first: Callable[[], None]) -> None:
    """At exit: finalize the MPI that `init()` started, once unison's job has ended cleanly.

    A forked child must not act for its parent's rank. After a broken job (a rank failed, froze or
    stalled) the exit agreement of `unison._job.failure` still needs MPI, and a finalize could wait for
    a rank that will not come: the process then ends without it, as mpi4py's own exit would.
    """
    if _failure.is_forked_child():
        return
    finalize_first()
    if _failure._state.broken_reason:
        return
    from ...backends.mpi import finalize_mpi

    finalize_mpi(mpi)
