"""`Compression`: the built-in schemes by name, on NumPy arrays."""

from __future__ import annotations

from ._casts import BF16Compressor, FP16Compressor, NoneCompressor
from ._partial import PartialSync
from ._powersgd import PowerSGDCompressor
from ._sparse import ThresholdCompressor, TopKCompressor

__all__ = ["Compression"]


class Compression:
    """The built-in schemes on NumPy arrays; the adapters' ``Compression`` mirror these names."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    topk = TopKCompressor
    threshold = ThresholdCompressor
    partial = PartialSync
    powersgd = PowerSGDCompressor
