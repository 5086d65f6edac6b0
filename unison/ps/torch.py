"""PyTorch on parameter servers: `DistributedEmbedding` and `ServerOptimizer` (`unison.adapters.torch.ps`).

Example:
    >>> import unison.ps as ps, unison.ps.torch as pst                          # doctest: +SKIP
    >>> model = nn.Sequential(pst.DistributedEmbedding("emb", 1_000_000, 16, mode="sum"), nn.Linear(16, 1))
    >>> opt = pst.ServerOptimizer(model, ps.Adam(0.01))                          # doctest: +SKIP
"""

from ..adapters.torch.ps import DistributedEmbedding, ServerOptimizer

__all__ = ["DistributedEmbedding", "ServerOptimizer"]
