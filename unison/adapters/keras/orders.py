"""The Keras DistributedOptimizer in horovod.keras's and horovod.tensorflow's positional orders.

Horovod has three signatures for one wrapper: horovod.tensorflow.keras's (the order of
`optimizer.DistributedOptimizer`), horovod.keras's (`num_groups` and `groups` right after `op`, no
aggregation or process-set arguments) and horovod.tensorflow's (`use_locking` third, then its own
order). A script that passes them by position must reach the same parameters under unison.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..array_compression import Compression
from .optimizer import DistributedOptimizer

if TYPE_CHECKING:
    from ...compression import Compressor

__all__ = ["KerasDistributedOptimizer", "TensorFlowDistributedOptimizer"]

# Keras 3's or Keras 2's optimizer, wrapped in place and returned.
_OptimizerT = TypeVar("_OptimizerT")


def KerasDistributedOptimizer(optimizer: _OptimizerT, name: str | None = None, device_dense: str = "",
                              device_sparse: str = "",
                              compression: type[Compressor] | Compressor = Compression.none,
                              sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                              op: ReduceOp | int = ReduceOp.AVERAGE, num_groups: int = 0,
                              groups: int | Sequence[Sequence[object]] | None = None, *,
                              backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                              process_set: ProcessSet = global_process_set,
                              scale_local_gradients: bool = True) -> _OptimizerT:
    """`DistributedOptimizer` in horovod.keras's order; ``unison.keras.DistributedOptimizer`` is this.

    horovod.keras's wrapper stops at `groups`; the aggregation and process-set arguments of
    horovod.tensorflow.keras are accepted here by keyword.

    Example:
        >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))   # doctest: +SKIP
    """
    return DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                                compression=compression, sparse_as_dense=sparse_as_dense,
                                gradient_predivide_factor=gradient_predivide_factor, op=op,
                                backward_passes_per_step=backward_passes_per_step,
                                average_aggregated_gradients=average_aggregated_gradients,
                                num_groups=num_groups, groups=groups, process_set=process_set,
                                scale_local_gradients=scale_local_gradients)


def TensorFlowDistributedOptimizer(optimizer: _OptimizerT, name: str | None = None, use_locking: bool = False,
                                   device_dense: str = "", device_sparse: str = "",
                                   compression: type[Compressor] | Compressor = Compression.none,
                                   sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                                   op: ReduceOp | int = ReduceOp.AVERAGE,
                                   gradient_predivide_factor: float = 1.0,
                                   average_aggregated_gradients: bool = False, num_groups: int = 0,
                                   groups: int | Sequence[Sequence[object]] | None = None,
                                   process_set: ProcessSet = global_process_set,
                                   scale_local_gradients: bool = True) -> _OptimizerT:
    """`DistributedOptimizer` in horovod.tensorflow's order; ``unison.tensorflow.DistributedOptimizer`` is this.

    It wraps Keras optimizers: Keras 3's, or Keras 2's (tf_keras, ``tf.keras`` under
    ``TF_USE_LEGACY_KERAS=1``), and TF1's ``tf.compat.v1.train.Optimizer`` for graphs run by a
    session (`unison.adapters.tensorflow.v1_optimizer`, where `use_locking` is the wrapper's own).

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))   # doctest: +SKIP
    """
    tf = sys.modules.get("tensorflow")  # a TF1 optimizer means TensorFlow is loaded; never import it here
    if tf is not None and isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from ..tensorflow.v1_optimizer import distributed_v1_optimizer

        return distributed_v1_optimizer(  # type: ignore[return-value]
            optimizer, name, use_locking, compression, sparse_as_dense, op, gradient_predivide_factor,
            backward_passes_per_step, average_aggregated_gradients, process_set, scale_local_gradients)
    return DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                                compression=compression, sparse_as_dense=sparse_as_dense,
                                gradient_predivide_factor=gradient_predivide_factor, op=op,
                                backward_passes_per_step=backward_passes_per_step,
                                average_aggregated_gradients=average_aggregated_gradients,
                                num_groups=num_groups, groups=groups, process_set=process_set,
                                scale_local_gradients=scale_local_gradients)
