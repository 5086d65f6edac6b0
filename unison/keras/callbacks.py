"""``hvd.callbacks``: the Keras 3 callbacks for distributed training (re-exported)."""

from ..adapters.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from ..adapters.keras.checkpoint import KerasBestModelCheckpoint as BestModelCheckpoint

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
