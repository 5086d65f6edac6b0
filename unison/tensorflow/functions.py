"""``horovod.tensorflow.functions``: broadcasting variables and objects."""

from . import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables

__all__ = ["allgather_object", "broadcast_object", "broadcast_object_fn", "broadcast_variables"]
