"""``import unison.keras as hvd``: Horovod's Keras API for Keras 3 (tensorflow or torch backend), or Keras 2 as tf.keras."""

from .._job.elastic_module import elastic_getattr as _elastic_getattr
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
from ..adapters.keras.flavour import keras_path_is_keras2 as _keras_path_is_keras2
from ..adapters.keras.functions import (
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    reducescatter,
)
from ..adapters.keras.optimizer import PartialDistributedOptimizer
from ..adapters.keras.orders import KerasDistributedOptimizer as DistributedOptimizer
from ..ops import Adasum, Average, Sum
from ..process_sets import ProcessSet, global_process_set

# Keras 3, or Keras 2 when Keras 3 runs on TensorFlow and tf.keras is Keras 2 (TF_USE_LEGACY_KERAS=1
# with tf-keras installed); the optimizer wrapper takes either, by the optimizer it is given.
if _keras_path_is_keras2():
    from ..adapters.tf_keras.optimizer import install_compile_hook as _install_compile_hook
    from ..adapters.tf_keras.saving import load_model

    _install_compile_hook()
else:
    from ..adapters.keras.saving import load_model  # type: ignore[assignment]
from . import callbacks  # noqa: E402  (after the choice above, which it repeats)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "add_process_set",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "statistics",
    "stop_timeline",
]

# `hvd.elastic` imports the elastic submodule on first use, as Horovod's module attribute does (the
# submodule imports the framework, which this module may not need).
__getattr__ = _elastic_getattr(__name__)
