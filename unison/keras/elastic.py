"""Elastic training for Keras (``horovod.keras.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)                   # doctest: +SKIP
    >>> callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
    ...              hvd.elastic.CommitStateCallback(state)]                      # doctest: +SKIP
"""

from ..elastic._state import HostsUpdatedInterrupt, run
from ..elastic._tensorflow import (
    CommitStateCallback,
    TensorFlowKerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)

KerasState = TensorFlowKerasState

__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
