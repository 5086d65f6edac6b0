"""``import unison.tensorflow.keras as hvd``: unison.keras's API in horovod.tensorflow.keras's signatures, for the Keras that tf.keras is."""

from ..._job.elastic_module import elastic_getattr as _elastic_getattr
from ...adapters.keras.flavour import tf_keras_is_keras2 as _tf_keras_is_keras2
from ...adapters.keras.optimizer import DistributedOptimizer
from ...keras import (
    Adasum,
    Average,
    Compression,
    PartialDistributedOptimizer,
    ProcessSet,
    Sum,
    add_process_set,
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
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
    reducescatter,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    statistics,
    stop_timeline,
)

# Keras 3, or Keras 2 when tf.keras is Keras 2 (TF_USE_LEGACY_KERAS=1 with tf-keras installed); the
# optimizer wrapper takes either, by the optimizer it is given.
if _tf_keras_is_keras2():
    from ...adapters.tf_keras.optimizer import install_compile_hook as _install_compile_hook
    from ...adapters.tf_keras.saving import load_model

    _install_compile_hook()
else:
    from ...adapters.keras.saving import load_model  # type: ignore[assignment]
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
