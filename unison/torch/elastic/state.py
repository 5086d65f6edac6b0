"""``horovod.torch.elastic.state``: `TorchState`."""

from ...adapters.torch.elastic import TorchState

__all__ = ["TorchState"]
