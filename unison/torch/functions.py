"""``horovod.torch.functions``: broadcasting parameters, optimizer state and objects."""

from . import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
