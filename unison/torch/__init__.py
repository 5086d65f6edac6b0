"""The PyTorch API of unison: ``import unison.torch as hvd`` is a drop-in for ``horovod.torch``.

Example:
    >>> import torch, unison.torch as hvd                                   # doctest: +SKIP
    >>> hvd.init()                                                          # doctest: +SKIP
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                named_parameters=model.named_parameters())  # doctest: +SKIP
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)          # doctest: +SKIP
    >>> hvd.broadcast_optimizer_state(opt, root_rank=0)                    # doctest: +SKIP
"""

from .._job.collectives import barrier, poll
from .._job.elastic_module import elastic_getattr as _elastic_getattr
from .._job.objects import add_process_set, allgather_object, broadcast_object, remove_process_set
from .._job.runtime import (
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
from ..adapters.torch.autograd import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from ..adapters.torch.collectives import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from ..adapters.torch.compression import Compression, Compressor
from ..adapters.torch.functions import broadcast_optimizer_state, broadcast_parameters
from ..adapters.torch.join import join
from ..adapters.torch.optimizer import DistributedOptimizer
from ..adapters.torch.sync_batch_norm import SyncBatchNorm
from ..errors import GradientCountError, HorovodInternalError, MissingGradientError, UnisonError
from ..ops import Adasum, Average, Max, Min, Product, Sum
from ..process_sets import ProcessSet, global_process_set
from . import distributed as _distributed  # noqa: F401 - registers torch.distributed's "unison" backend

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "GradientCountError",
    "HorovodInternalError",
    "Max",
    "Min",
    "MissingGradientError",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "UnisonError",
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
    "broadcast_optimizer_state",
    "broadcast_parameters",
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
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "statistics",
    "stop_timeline",
    "synchronize",
]

# `hvd.elastic` imports the elastic submodule on first use, as Horovod's module attribute does (the
# submodule imports the framework, which this module may not need).
__getattr__ = _elastic_getattr(__name__)
