"""``horovod.tensorflow.util``: the helper Horovod's TensorFlow scripts and tests call through ``hvd.util``."""

from ..adapters.tensorflow._bridge import executing_eagerly as _executing_eagerly

__all__ = ["_executing_eagerly"]
