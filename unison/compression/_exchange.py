"""Run a sparsifier's or a partial-sync schedule's exchange on NumPy arrays through the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _collectives as core
from ..ops import CollectiveKind, ReduceOp
from ..process_sets import ProcessSet
from ._base import payload_bytes
from ._partial import PartialSync
from ._sparse import Sparsifier

__all__ = ["average_slices_", "sparsified_allreduce"]


def sparsified_allreduce(compressor: Sparsifier, arrays: Sequence[np.ndarray], names: Sequence[str],
                         group_name: str, process_set: ProcessSet, scale: float) -> list[np.ndarray]:
    """Sum `arrays` across the set as sparsified (index, value) pairs, times `scale`; error feedback
    is kept in `compressor` under each array's name. One grouped allgather carries every pair."""
    payloads: list[np.ndarray] = []
    contexts: list[Any] = []
    for array, name in zip(arrays, names):
        payload, ctx = compressor.compress(np.asarray(array), name)
        payloads.extend(payload)
        contexts.append(ctx)
    handle, _, _ = core.submit(CollectiveKind.ALLGATHER, payloads, f"sparsified.{group_name}", process_set,
                               grouped=True)
    gathered = core.synchronize(handle)
    out = []
    for index, ctx in enumerate(contexts):
        summed = compressor.decompress((gathered[2 * index], gathered[2 * index + 1]), ctx)
        out.append(summed * summed.dtype.type(scale))
    return out


def average_slices_(schedule: PartialSync, arrays: Sequence[np.ndarray], group_name: str,
                    process_set: ProcessSet) -> dict[str, Any]:
    """Average this step's slice of `arrays` (flat-contiguous, written in place) across the set.

    Returns the step's counters: dense and payload bytes.
    """
    plan = schedule.next_plan([a.size for a in arrays])
    views = [arrays[i].reshape(-1)[start:stop] for i, start, stop in plan]
    dense = sum(a.nbytes for a in arrays)
    sent = sum(payload_bytes(v) for v in views)
    schedule.count(dense, sent)
    if views:
        part = (schedule.step - 1) % schedule.parts
        handle, _, _ = core.submit(CollectiveKind.ALLREDUCE, views, f"partial.{group_name}.{part}",
                                   process_set, in_place=True, grouped=True, op=ReduceOp.AVERAGE)
        core.synchronize(handle)
    return {"dense_bytes": dense, "payload_bytes": sent}
