"""``horovod.torch.elastic.sampler``: `ElasticSampler`."""

from ...elastic._torch import ElasticSampler

__all__ = ["ElasticSampler"]
