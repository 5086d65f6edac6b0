"""``hvd.callbacks``: the callbacks for distributed training, for the Keras that ``unison.keras`` serves (re-exported)."""

from ..adapters.keras.flavour import keras_path_is_keras2 as _keras_path_is_keras2

if _keras_path_is_keras2():
    from ..adapters.tf_keras.callbacks import (
        BroadcastGlobalVariablesCallback,
        LearningRateScheduleCallback,
        LearningRateWarmupCallback,
        MetricAverageCallback,
    )
    from ..adapters.tf_keras.callbacks import KerasBestModelCheckpoint as BestModelCheckpoint
else:
    from ..adapters.keras.callbacks import (  # type: ignore[assignment]
        BroadcastGlobalVariablesCallback,
        LearningRateScheduleCallback,
        LearningRateWarmupCallback,
        MetricAverageCallback,
    )
    from ..adapters.keras.checkpoint import (  # type: ignore[assignment]
        KerasBestModelCheckpoint as BestModelCheckpoint,
    )

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
