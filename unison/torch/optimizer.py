"""``horovod.torch.optimizer``: `DistributedOptimizer`."""

from . import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
