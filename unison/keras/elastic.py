"""Elastic training for Keras (``horovod.keras.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)                   # doctest: +SKIP
    >>> callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
    ...              hvd.elastic.CommitStateCallback(state)]                      # doctest: +SKIP
"""

from ..tensorflow.keras.elastic import (  # the same objects: one Keras API under both paths
    CommitStateCallback,
    HostsUpdatedInterrupt,
    KerasState,
    TensorFlowKerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)

__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
