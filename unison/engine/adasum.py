"""Adasum: adaptive summation of each tensor across a power-of-two number of ranks, on the CPU data plane.

The combination of two ranks' values ``a`` and ``b`` of one tensor is

    adasum(a, b) = (1 - a·b / (2 |a|²)) · a  +  (1 - a·b / (2 |b|²)) · b

with a coefficient of 1 where that squared norm is below `NORM_FLOOR`, the square root of float64's
smallest normal number (about 1.5e-154), as in Horovod: a zero gradient leaves the other unchanged,
and a gradient whose entries are near float32's smallest normal value (a squared norm near 1e-73)
is still weighted by the formula. Identical vectors give their value (like an average), orthogonal
ones their sum, opposite ones cancel only as far as they agree. Over ``2^k`` ranks it is applied as
a binary tree: ranks (0, 1), (2, 3), ... first, then the pairs' results (01, 23), and so on, so that
rank order decides the tree and every rank ends with the same bits.

The run is recursive vector halving with distance doubling (the CPU algorithm of the Adasum paper):
at the level of distance ``d`` a rank and its partner ``rank ^ d`` hold the same segment of their
groups' vectors; the lower one keeps the first half and sends the second, the upper one the
reverse; each then holds both groups' values on its half. The three dot products of every tensor
(a·b, a·a, b·b) are summed over the ``2d`` ranks whose halves make up the whole vector, and each
rank combines its half. After ``log2(size)`` levels each rank holds ``1/size`` of the result, and
one allgather returns the whole vector to everyone. Each rank sends about as much as in a ring
allreduce: half its data over the levels, then the allgather.

Dot products accumulate in float64 and are summed over the group in ascending rank order (they
travel by allgather rather than by a reduction whose order the transport would choose), so each
level's coefficients are the same bits on every rank of the group. Values are combined in float64
and stored in the working dtype (float32 for float16/bfloat16 and float32 tensors, float64 for
float64) after every level.

`plan` is the pure part (who exchanges what, with whom); `adasum_` runs it over a `Backend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..backends.base import Backend

__all__ = ["NORM_FLOOR", "Level", "adasum_", "coefficients", "is_power_of_two", "plan"]

NORM_FLOOR = float(np.sqrt(np.finfo(np.float64).tiny))


@dataclasses.dataclass(frozen=True)
class Level:
    """One halving step for one rank: it exchanges with `partner`, keeps ``keep`` and gives ``give``.

    Ranges are ``(start, stop)`` element offsets into the whole (fused) vector. `lower` says whether
    this rank is the lower of the pair: its own values are then ``a`` (the lower group's).
    """

    distance: int
    partner: int
    lower: bool
    keep: tuple[int, int]
    give: tuple[int, int]


def is_power_of_two(size: int) -> bool:
    """Whether `size` is 1, 2, 4, 8, ..."""
    return size >= 1 and size & (size - 1) == 0


def plan(rank: int, size: int, count: int) -> tuple[list[Level], tuple[int, int]]:
    """The levels `rank` runs over a vector of `count` elements, and the segment it holds at the end.

    Raises:
        ValueError: `size` is not a power of two, or `rank` is not in ``range(size)``.
    """
    if not is_power_of_two(size):
        raise ValueError(f"Adasum needs a power-of-two number of ranks. Got size={size}.")
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in range(size={size}). Got rank={rank}.")
    levels = []
    start, stop = 0, count
    distance = 1
    while distance < size:
        middle = start + (stop - start) // 2
        lower = rank & distance == 0
        first, second = (start, middle), (middle, stop)
        keep, give = (first, second) if lower else (second, first)
        levels.append(Level(distance, rank ^ distance, lower, keep, give))
        start, stop = keep
        distance *= 2
    return levels, (start, stop)


def coefficients(dots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor coefficients of ``a`` and ``b`` from rows of (a·b, |a|², |b|²) in float64."""
    dot, a_norm, b_norm = dots[:, 0], dots[:, 1], dots[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        a_coeff = np.where(a_norm >= NORM_FLOOR, 1.0 - dot / a_norm * 0.5, 1.0)
        b_coeff = np.where(b_norm >= NORM_FLOOR, 1.0 - dot / b_norm * 0.5, 1.0)
    return a_coeff, b_coeff


def _pieces(offsets: np.ndarray, span: tuple[int, int]) -> list[tuple[int, int, int]]:
    """(tensor index, start, stop) for each tensor that overlaps `span`, clipped to it."""
    start, stop = span
    out = []
    for index in range(len(offsets) - 1):
        lo, hi = max(start, int(offsets[index])), min(stop, int(offsets[index + 1]))
        if lo < hi:
            out.append((index, lo, hi))
    return out


def adasum_(work: np.ndarray, lengths: Sequence[int], backend: Backend, rank: int, size: int,
            process_set_id: int = 0) -> None:
    """Replace `work` (a flat float32/float64 vector of tensors of `lengths`) by its Adasum over ranks.

    A collective: every rank of the set calls it with the same `lengths`; `rank` and `size` are
    this rank's place in the set.
    """
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    levels, final = plan(rank, size, int(offsets[-1]))
    tensors = len(lengths)
    zeros = [0] * size
    for level in levels:
        keep_start, keep_stop = level.keep
        give_start, give_stop = level.give
        received = np.empty(keep_stop - keep_start, work.dtype)
        send_counts, recv_counts = list(zeros), list(zeros)
        send_counts[level.partner] = give_stop - give_start
        recv_counts[level.partner] = keep_stop - keep_start
        backend.alltoallv(work[give_start:give_stop], send_counts, received, recv_counts, process_set_id)

        mine = work[keep_start:keep_stop]
        a, b = (mine, received) if level.lower else (received, mine)
        partial = np.zeros((tensors, 3), np.float64)
        pieces = [(index, lo, hi, a[lo - keep_start : hi - keep_start].astype(np.float64),
                   b[lo - keep_start : hi - keep_start].astype(np.float64))
                  for index, lo, hi in _pieces(offsets, level.keep)]
        for index, _, _, a64, b64 in pieces:
            partial[index] = (np.dot(a64, b64), np.dot(a64, a64), np.dot(b64, b64))
        everyone = np.empty((size, tensors, 3), np.float64)
        backend.allgatherv(partial.reshape(-1), everyone.reshape(-1), [3 * tensors] * size,
                           process_set_id)
        group_start = rank - rank % (2 * level.distance)
        dots = everyone[group_start]
        for member in range(group_start + 1, group_start + 2 * level.distance):
            dots = dots + everyone[member]
        a_coeff, b_coeff = coefficients(dots)
        for index, lo, hi, a64, b64 in pieces:
            work[lo:hi] = a_coeff[index] * a64 + b_coeff[index] * b64

    if size > 1:
        segments = [plan(member, size, int(offsets[-1]))[1] for member in range(size)]
        gathered = np.empty(int(offsets[-1]), work.dtype)
        backend.allgatherv(np.ascontiguousarray(work[final[0] : final[1]]), gathered,
                           [stop - start for start, stop in segments], process_set_id)
        position = 0
        for start, stop in segments:
            work[start:stop] = gathered[position : position + stop - start]
            position += stop - start
