"""Elastic training (horovod.torch.elastic) is not available in unison yet: importing this module says so."""

from .._elastic import unavailable

raise unavailable(__name__)
