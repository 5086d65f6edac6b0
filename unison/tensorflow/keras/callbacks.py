"""``hvd.callbacks`` of ``unison.tensorflow.keras``: the Keras 3 callbacks in horovod.tensorflow.keras's signatures."""

from ...adapters.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from ...adapters.keras.checkpoint import BestModelCheckpoint

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
