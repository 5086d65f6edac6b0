"""How a count of elements or rows is split among ranks: the one rule every backend and the coordinator share."""

from __future__ import annotations

__all__ = ["split_counts"]


def split_counts(count: int, parts: int) -> list[int]:
    """Split `count` elements into `parts` contiguous pieces; the first ``count % parts`` get one extra.

    Example:
        >>> split_counts(5, 3)
        [2, 2, 1]
    """
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
