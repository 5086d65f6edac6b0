"""``horovod.tensorflow.sync_batch_norm``: `SyncBatchNormalization`."""

from . import SyncBatchNormalization

__all__ = ["SyncBatchNormalization"]
