"""``horovod.tensorflow.compression``: the gradient compressors."""

from . import Compression

__all__ = ["Compression"]
