"""torch's `join(device=-1)`: Horovod's signature over the framework-neutral join."""

from __future__ import annotations

import operator

from ..._job import collectives as _collectives
from ...errors import InvalidArgumentError

__all__ = ["join"]


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; block until every rank has joined.

    Until then this rank contributes zeros to the other ranks' allreduces (Average still divides by
    the full set size, as in Horovod).

    Args:
        device: where Horovod makes those zeros: -1 for the CPU (the default), else a GPU index such
            as ``hvd.local_rank()``. unison makes them in its own buffers, so any valid value
            behaves the same; it is checked so that a typo fails on the calling rank.

    Returns:
        The rank that joined last, the same int on every rank.

    Example:
        >>> for batch in my_batches:                       # doctest: +SKIP
        ...     train_step(batch)
        >>> last = hvd.join(hvd.local_rank())              # doctest: +SKIP
    """
    try:
        index = -2 if isinstance(device, bool) else operator.index(device)
    except TypeError:
        index = -2
    if index < -1:
        raise InvalidArgumentError(
            "join(device) takes -1 (the CPU) or a GPU index >= 0, such as hvd.local_rank(). "
            f"Got device={device!r}."
        )
    return int(_collectives.join())
