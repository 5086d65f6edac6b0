"""Elastic training for Keras (``horovod.tensorflow.keras.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)                   # doctest: +SKIP
    >>> callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
    ...              hvd.elastic.CommitStateCallback(state)]                      # doctest: +SKIP
"""

from ...adapters.keras.flavour import tf_keras_is_keras2 as _tf_keras_is_keras2
from ...adapters.tensorflow.elastic import TensorFlowKerasState
from ...elastic._state import HostsUpdatedInterrupt, run

# The callbacks of the Keras that tf.keras is: Keras 3, or Keras 2 under TF_USE_LEGACY_KERAS=1.
if _tf_keras_is_keras2():
    from ...adapters.tf_keras.elastic import (
        CommitStateCallback,
        UpdateBatchStateCallback,
        UpdateEpochStateCallback,
    )
else:
    from ...adapters.tensorflow.elastic import (  # type: ignore[assignment]
        CommitStateCallback,
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
