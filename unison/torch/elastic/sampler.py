"""``horovod.torch.elastic.sampler``: `ElasticSampler`."""

from ...adapters.torch.elastic import ElasticSampler

__all__ = ["ElasticSampler"]
