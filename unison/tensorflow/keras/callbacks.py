"""``hvd.callbacks`` of ``unison.tensorflow.keras``: the callbacks for the Keras that ``tf.keras`` is, in horovod.tensorflow.keras's signatures."""

from ...adapters.keras.flavour import tf_keras_is_keras2 as _tf_keras_is_keras2

if _tf_keras_is_keras2():
    from ...adapters.tf_keras.callbacks import (
        BestModelCheckpoint,
        BroadcastGlobalVariablesCallback,
        LearningRateScheduleCallback,
        LearningRateWarmupCallback,
        MetricAverageCallback,
    )
else:
    from ...adapters.keras.callbacks import (  # type: ignore[assignment]
        BroadcastGlobalVariablesCallback,
        LearningRateScheduleCallback,
        LearningRateWarmupCallback,
        MetricAverageCallback,
    )
    from ...adapters.keras.checkpoint import BestModelCheckpoint  # type: ignore[assignment]

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
