"""``horovod.torch.elastic.state``: `TorchState`."""

from ...elastic._torch import TorchState

__all__ = ["TorchState"]
