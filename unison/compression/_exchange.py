"""Run the self-reducing schemes (sparsifiers, PowerSGD) and the partial-sync schedule through the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._job import submit as core
from ..ops import CollectiveKind, ReduceOp
from ..process_sets import ProcessSet
from ._base import Exchange, payload_bytes
from ._partial import PartialSync
from ._powersgd import PowerSGDCompressor
from ._sparse import Sparsifier

__all__ = ["average_slices_", "lowrank_allreduce", "self_reduced", "self_reduced_allreduce", "sparsified_allreduce"]


def self_reduced(compressor: Any) -> bool:
    """True for schemes that run their own exchange (`self_reduced_allreduce`) instead of one allreduce."""
    return getattr(compressor, "exchange", Exchange.ALLREDUCE) in (Exchange.ALLGATHER, Exchange.LOWRANK)


def self_reduced_allreduce(compressor: Any, arrays: Sequence[np.ndarray], names: Sequence[str],
                           group_name: str, process_set: ProcessSet, scale: float) -> list[np.ndarray]:
    """Sum `arrays` across the set through `compressor`'s own exchange, times `scale`."""
    if compressor.exchange is Exchange.LOWRANK:
        return lowrank_allreduce(compressor, arrays, names, group_name, process_set, scale)
    return sparsified_allreduce(compressor, arrays, names, group_name, process_set, scale)


def lowrank_allreduce(compressor: PowerSGDCompressor, arrays: Sequence[np.ndarray], names: Sequence[str],
                      group_name: str, process_set: ProcessSet, scale: float) -> list[np.ndarray]:
    """Sum `arrays` across the set with PowerSGD, times `scale`: one grouped allreduce of every P
    factor and every uncompressible tensor, then one of every Q factor."""
    states, factors, dense, dense_arrays = [], [], [], []
    for index, (array, name) in enumerate(zip(arrays, names)):
        array = np.asarray(array)
        if compressor.matrix_shape(tuple(array.shape)) is None:
            compressor.count_uncompressed(array.nbytes)
            dense.append(index)
            dense_arrays.append(np.array(array, copy=True, order="C"))  # reduced in place
            continue
        p, state = compressor.begin(array, str(name))
        states.append((index, state))
        factors.append(p)
    first = factors + dense_arrays
    out: list[Any] = [None] * len(arrays)
    if not first:
        return out
    summed = _grouped_sum(first, f"powersgd.p.{group_name}", process_set)
    for index, reduced in zip(dense, summed[len(states):]):
        out[index] = reduced * reduced.dtype.type(scale)
    if states:
        qs = [compressor.middle(state, reduced) for (_, state), reduced in zip(states, summed)]
        q_sums = _grouped_sum(qs, f"powersgd.q.{group_name}", process_set)
        for (index, state), q_sum in zip(states, q_sums):
            result = compressor.end(state, q_sum)
            out[index] = result * result.dtype.type(scale)
    return out


def _grouped_sum(arrays: list[np.ndarray], name: str, process_set: ProcessSet) -> list[np.ndarray]:
    handle, _, _ = core.submit(CollectiveKind.ALLREDUCE, arrays, name, process_set, in_place=True,
                               grouped=True, op=ReduceOp.SUM)
    core.synchronize(handle)
    return arrays


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
