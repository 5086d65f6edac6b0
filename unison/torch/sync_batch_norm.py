"""``horovod.torch.sync_batch_norm``: `SyncBatchNorm`."""

from . import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
