"""`Compression`: the built-in schemes by name, on NumPy arrays."""

from __future__ import annotations

from ._base import Compressor
from ._casts import BF16Compressor, FP16Compressor, NoneCompressor
from ._partial import PartialSync
from ._powersgd import PowerSGDCompressor
from ._sparse import ThresholdCompressor, TopKCompressor

__all__ = ["Compression"]


class Compression:
    """The built-in schemes on NumPy arrays; the adapters subclass it, replacing the casts."""

    # the casts: the adapters replace them with their framework's (torch or tf tensors)
    none: type[Compressor] = NoneCompressor
    fp16: type[Compressor] = FP16Compressor
    bf16: type[Compressor] = BF16Compressor
    topk = TopKCompressor
    threshold = ThresholdCompressor
    partial = PartialSync
    powersgd = PowerSGDCompressor
