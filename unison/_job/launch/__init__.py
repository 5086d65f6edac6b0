"""How a process becomes a rank: one plug-in per launch, found by `detect`.

`base` draws the interface (`Launch`: join, check_start, place, exchange, connect) and the one
settings agreement every launch runs; `mpi` (unisonrun, mpiexec, srun, a communicator), `rendezvous`
(a torch store: torchrun and torch's env:// variables, or what ``init_process_group`` hands the
backend: env://, tcp://, file://, ``store=``), `elastic` (a worker of unisonrun's elastic driver,
which joins one membership epoch after another in the same process), `single` (one process alone)
are the launches.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from ...config import Settings
from ..torch_launch import torch_job_of_one, torch_launch, torch_launched_alone
from .base import Launch, Place, Request, agree_settings
from .elastic import ElasticLaunch, elastic_worker
from .mpi import MpiLaunch, started_by_mpi
from .rendezvous import TorchRendezvous
from .single import SingleProcess

__all__ = ["Launch", "Place", "Request", "agree_settings", "detect"]


def detect(comm: Any = None, request: Request | None = None,
           finalize_first: Callable[[], None] = lambda: None, settings: Settings | None = None) -> Launch:
    """The launch this process is part of, in order of precedence:

    1. a communicator given to `init` (``comm``), or an MPI launcher that started several processes
       (unisonrun, mpiexec; srun too, unless ``init_process_group`` handed a store): MPI. A rank of such
       a job keeps its rank, and ``init_process_group``'s factory checks what it was given against it;
    2. a worker that unisonrun's elastic driver started itself (`settings` name the driver and a
       worker's launcher directory): the elastic launch;
    3. a store from ``init_process_group`` (``request``): the torch rendezvous at that store;
    4. torch's env:// variables of a job of several processes: the torch rendezvous at their store;
       torch's variables that count this process as one of several with no store to meet at: refused;
    5. mpi4py installed (and no torch launch of this process alone): MPI, a job of one or a singleton;
    6. else this process alone.

    `finalize_first` runs at exit before the MPI that `init()` started is finalized.
    """
    if comm is not None or started_by_mpi(srun_too=request is None):
        return MpiLaunch(comm, finalize_first)
    worker = elastic_worker(settings) if settings is not None else None
    if worker is not None:
        return ElasticLaunch(worker)
    if request is not None:
        return TorchRendezvous(request=request)
    launch = torch_launch()
    if launch is not None:
        return TorchRendezvous(launch=launch)
    alone = torch_job_of_one()
    if alone is not None:
        raise alone
    if importlib.util.find_spec("mpi4py") is not None and not torch_launched_alone():
        return MpiLaunch(None, finalize_first)
    return SingleProcess()
