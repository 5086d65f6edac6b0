"""The Keras elastic callbacks on Keras 2's (tf_keras) Callback: the same logic as the Keras 3 classes."""

from __future__ import annotations

import tf_keras

from ...adapters.tensorflow.elastic import CommitStateLogic, UpdateBatchStateLogic, UpdateEpochStateLogic

__all__ = ["CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]


class CommitStateCallback(CommitStateLogic, tf_keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of every epoch (Keras 2)."""


class UpdateBatchStateCallback(UpdateBatchStateLogic, tf_keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch (Keras 2); see `UpdateBatchStateLogic`."""


class UpdateEpochStateCallback(UpdateEpochStateLogic, tf_keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs finished since the job began (Keras 2)."""
