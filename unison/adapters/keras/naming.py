"""Names of a Keras step's collectives that every rank agrees on, whatever its layers happen to be called.

A model loaded from a file and the same model built afresh hold the same variables in the same
order, but not always under the same names: Keras 3 drops the model's name from a loaded layer's
variable paths (``dense/kernel`` against ``sequential/dense/kernel``), and either Keras numbers
layers per process (``dense_3`` in a process that built other models first). So the gradient
groups of the DistributedOptimizers and the broadcasts of BroadcastGlobalVariablesCallback are named
by each variable's place in its list, with its shape and dtype, never by its path; Horovod's
resume recipe (rank 0 loads a checkpoint, the others build the model) then negotiates the same
names on every rank.

Example:
    >>> import numpy as np
    >>> variable_keys([np.zeros((3, 2), np.float32), np.zeros(2, np.float32)])
    ['0:3x2:float32', '1:2:float32']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, SupportsIndex

__all__ = ["Shaped", "variable_keys"]


class Shaped(Protocol):
    """What a key is made of: the shape and dtype of a variable (either Keras's), a tensor or an array."""

    @property
    def shape(self) -> Iterable[SupportsIndex]: ...

    @property
    def dtype(self) -> object: ...


def variable_keys(variables: Sequence[Shaped]) -> list[str]:
    """One key per variable: its position in `variables`, its shape and its dtype."""
    keys = []
    for i, v in enumerate(variables):
        shape = "x".join(str(int(d)) for d in tuple(v.shape))
        dtype = getattr(v.dtype, "name", v.dtype)
        keys.append(f"{i}:{shape}:{dtype}")
    return keys
