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
from ..adapters.keras.flavour import tf_keras_is_keras2 as _tf_keras_is_keras2
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
from ..adapters.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape
from ..ops import Adasum, Average, Max, Min, Product, Sum
from ..process_sets import ProcessSet, global_process_set

# The Keras `tf.keras` is when this module is imported: Keras 2's layer under TF_USE_LEGACY_KERAS=1.
if _tf_keras_is_keras2():
    from ..adapters.tf_keras.sync_batch_norm import SyncBatchNormalization
else:
    from ..adapters.tensorflow.sync_batch_norm import SyncBatchNormalization

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

# `hvd.mpi_ops` and `hvd.util` are attributes without an import of their own, as in Horovod (its
# scripts and tests read `hvd.mpi_ops._basics` and `hvd.util._executing_eagerly`); `_executing_eagerly`
# is Horovod's module attribute too.
from . import mpi_ops as mpi_ops  # noqa: E402  (it re-exports names defined above)
from . import util as util  # noqa: E402
from .util import _executing_eagerly as _executing_eagerly  # noqa: E402

# `hvd.elastic` imports the elastic submodule on first use, as Horovod's module attribute does (the
# submodule imports the framework, which this module may not need).
__getattr__ = _elastic_getattr(__name__)
