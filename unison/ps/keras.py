"""Keras 3 on parameter servers: `DistributedEmbedding` and `ServerOptimizer` (`unison.adapters.keras.ps`).

Example:
    >>> import keras, unison.ps as ps, unison.ps.keras as psk                     # doctest: +SKIP
    >>> layer = psk.DistributedEmbedding("emb", 1_000_000, 16)                    # doctest: +SKIP
"""

from ..adapters.keras.ps import DistributedEmbedding, ServerOptimizer

__all__ = ["DistributedEmbedding", "ServerOptimizer"]
