"""``horovod.torch.compression``: the gradient compressors."""

from . import Compression, Compressor

__all__ = ["Compression", "Compressor"]
