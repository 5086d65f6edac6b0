"""unison: a pure-Python, Horovod-compatible coordinator for data-parallel training.

This module is the framework-neutral API on NumPy arrays; ``unison.torch``, ``unison.tensorflow`` and
``unison.keras`` offer the same on framework tensors. Importing it does not initialize MPI, and does not load the launcher: ``unison.run`` imports
``unison.launcher`` on first use.

Example:
    >>> import numpy as np
    >>> import unison as hvd
    >>> hvd.init()
    >>> hvd.allreduce(np.array([1.0, 2.0]), op=hvd.Sum)   # on one process: unchanged
    array([1., 2.])
    >>> hvd.shutdown()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._job.collectives import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from ._job.objects import add_process_set, allgather_object, broadcast_object, remove_process_set
from ._job.runtime import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    statistics,
    stop_timeline,
)
from ._version import __version__
from .errors import HorovodInternalError, UnisonError
from .ops import Adasum, Average, Max, Min, Product, Sum
from .process_sets import ProcessSet, global_process_set

if TYPE_CHECKING:
    from .launcher import run

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "UnisonError",
    "__version__",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "run",
    "shutdown",
    "size",
    "start_timeline",
    "statistics",
    "stop_timeline",
    "synchronize",
]


def __getattr__(name: str) -> Any:
    """Load ``unison.run`` on first use: the launcher is unisonrun's, not a training process's."""
    if name == "run":
        from .launcher import run

        globals()["run"] = run
        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"run"})
