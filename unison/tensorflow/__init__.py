"""``import unison.tensorflow as hvd``: Horovod's TensorFlow API on unison (eager and tf.function)."""

from .._job.elastic_module import elastic_getattr as _elastic_getattr
from .._job.gpu_available import gpu_available
from .._job.objects import add_process_set, remove_process_set
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
from ..adapters.array_compression import Compression
from ..adapters.keras.orders import TensorFlowDistributedOptimizer as DistributedOptimizer
from ..adapters.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from ..adapters.tensorflow.functions import (
    allgather_object,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from ..adapters.tensorflow.legacy import broadcast_global_variables
from ..adapters.tensorflow.sync_batch_norm import SyncBatchNormalization
from ..adapters.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape
from ..ops import Adasum, Average, Max, Min, Product, Sum
from ..process_sets import ProcessSet, global_process_set

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "gpu_available",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "statistics",
    "stop_timeline",
]

# `hvd.elastic` imports the elastic submodule on first use, as Horovod's module attribute does (the
# submodule imports the framework, which this module may not need).
__getattr__ = _elastic_getattr(__name__)
