"""Comparing training modes on a shared machine: they take turns step by step; plain MPI as a reference.

The noise of a shared machine moves the speed of a whole run by 10% or more within a minute, so the
modes are not timed in runs of their own: `take_turns` runs one step of each mode in turn (the order
rotated by one each time), each step starting after a barrier, and keeps the slower rank's time of
every step. `average_in_place` is the reference a hand-written loop would use: blocking mpi4py
``Allreduce`` calls on the gradient's own memory, in unison's default chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
from mpi4py import MPI

__all__ = ["CHUNK_ELEMENTS", "average_in_place", "take_turns"]

CHUNK_ELEMENTS = 1 << 20  # 4 MiB of float32: unison's default UNISON_CHUNK_BYTES


def average_in_place(array: np.ndarray) -> None:
    """Average a contiguous array across COMM_WORLD in place, chunk by chunk, with blocking calls."""
    world = MPI.COMM_WORLD
    flat = array.reshape(-1)
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        world.Allreduce(MPI.IN_PLACE, flat[start : start + CHUNK_ELEMENTS])
    array /= world.Get_size()


def take_turns(runners: Mapping[str, Callable[[], object]], steps: int,
               warmup: int = 0) -> dict[str, list[float]] | None:
    """Seconds per step of every runner, `warmup` untimed rounds first; rank 0 gets the slower rank's
    time of each step, the other ranks None."""
    world = MPI.COMM_WORLD
    names = list(runners)
    mine: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + steps):
        turn = index % len(names)
        for name in names[turn:] + names[:turn]:
            world.Barrier()
            start = time.perf_counter()
            runners[name]()
            if index >= warmup:
                mine[name].append(time.perf_counter() - start)
    everyone = world.gather(mine)
    if everyone is None:
        return None
    return {name: [max(per_rank) for per_rank in zip(*(t[name] for t in everyone))] for name in names}
