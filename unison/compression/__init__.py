"""Gradient compression, framework-neutral: the compressor interface, casts, sparsifiers, partial sync.

Example:
    >>> from unison.compression import Compression
    >>> topk = Compression.topk(0.01)          # one instance per optimizer: it keeps residuals
"""

from ._base import Compressor, Exchange, payload_bytes
from ._casts import BF16Compressor, FP16Compressor, NoneCompressor
from ._partial import PartialSync, slice_plan
from ._powersgd import LowRankState, PowerSGDCompressor
from ._schemes import Compression
from ._sparse import SparseContext, Sparsifier, ThresholdCompressor, TopKCompressor, scatter_sum

__all__ = [
    "BF16Compressor",
    "Compression",
    "Compressor",
    "Exchange",
    "FP16Compressor",
    "LowRankState",
    "NoneCompressor",
    "PartialSync",
    "PowerSGDCompressor",
    "SparseContext",
    "Sparsifier",
    "ThresholdCompressor",
    "TopKCompressor",
    "payload_bytes",
    "scatter_sum",
    "slice_plan",
]
