"""``horovod.tensorflow.mpi_ops``: the TensorFlow collectives and basics under Horovod's module path.

``from horovod.tensorflow.mpi_ops import allgather, size_op`` becomes ``from
unison.tensorflow.mpi_ops import allgather, size_op``; every name is the same object as in
`unison.tensorflow` (both import it from where it is defined), which holds this module as
``hvd.mpi_ops``, as Horovod's does. ``_basics`` answers the process-set table reads of Horovod's
basics object (``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``). Horovod's module also
holds private ops (``_allreduce``); use `allreduce` of `unison.tensorflow` for those.
"""

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
    stop_timeline,
)
from ..adapters.tensorflow.basics import basics as _basics  # noqa: F401  (Horovod's private attribute)
from ..adapters.tensorflow.collectives import (
    allgather,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    join,
)
from ..adapters.tensorflow.functions import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from ..ops import Adasum, Average, Max, Min, Product, Sum
from ..process_sets import ProcessSet, global_process_set

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "alltoall",
    "broadcast",
    "broadcast_",
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
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
