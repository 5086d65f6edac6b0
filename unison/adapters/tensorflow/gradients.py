"""Reduce a step's gradients as tf tensors under a `GradientPolicy`: the graph ops of DistributedGradientTape and the Keras optimizer on TensorFlow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from ..._job.gradients import (
    GradientPolicy,
    allreduce_scaling,
    gradient_group_name,
    local_divisor,
    self_reduced_scale,
    split_local,
)
from ..._job.runtime import job
from ...compression._exchange import self_reduced, self_reduced_allreduce
from ...process_sets import ProcessSet
from ._bridge import graph_name, run
from ._bridge import no_autograph as _no_autograph
from .collectives import grouped_allreduce, set_size

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["reduce_gradients", "run_on_arrays"]


# `grads` holds tf.Tensor, tf.IndexedSlices or None: Any, as mypy cannot see that those divided are not None.
@_no_autograph
def reduce_gradients(policy: GradientPolicy, grads: Sequence[Any], names: Sequence[str],
                     local: Sequence[bool] = ()) -> list[tf.Tensor | tf.IndexedSlices | None]:
    """Return `grads` reduced across the policy's set in one grouped allreduce (None entries stay None).

    `names` (one per gradient, usually the variable names) fix the group's name, so every rank agrees
    on it and the engine's response cache recognises the same step. Gradients flagged in `local`
    are not reduced; the policy says whether they are divided by the set size, as Horovod does. On
    a rank outside the policy's process set the other gradients come back as they are (Horovod's
    tape and optimizers skip the reduction there), so every rank can run the same training code.
    """
    grads = list(grads)
    size = set_size(policy.process_set)
    chosen, kept = split_local([g is not None for g in grads], local)
    out = list(grads)
    divisor = local_divisor(policy, size)
    for i in kept:
        if divisor is not None:
            out[i] = grads[i] / tf.cast(divisor, grads[i].dtype)
    if not chosen or not _member_of(policy.process_set):
        return out
    if policy.sparse_as_dense:
        for i in chosen:
            if isinstance(grads[i], tf.IndexedSlices):
                grads[i] = tf.convert_to_tensor(grads[i])
    if self_reduced(policy.compression):
        scale = self_reduced_scale(policy, size)
        for i, r in zip(chosen, _sparsified(policy, grads, chosen, names, scale)):
            out[i] = r
        return out
    op, prescale, postscale = allreduce_scaling(policy)
    name = graph_name("DistributedGradients", gradient_group_name([names[i] for i in chosen]))
    reduced = grouped_allreduce([grads[i] for i in chosen], op=op, compression=policy.compression,
                                prescale_factor=prescale, postscale_factor=postscale,
                                process_set=policy.process_set, name=name)
    for i, r in zip(chosen, reduced):
        out[i] = r
    return out


def _member_of(process_set: ProcessSet) -> bool:
    """Whether this rank belongs to `process_set` (an unregistered set counts: its collective refuses it)."""
    current = job()
    members = current.set_members(process_set.process_set_id) if process_set.process_set_id is not None else None
    return members is None or current.rank in members


def run_on_arrays(fn: Callable[..., Sequence[npt.ArrayLike]], tensors: Sequence[tf.Tensor],
                  op_name: str) -> list[tf.Tensor]:
    """Run `fn` on the tensors' NumPy values (eagerly, or as one numpy_function op); same shapes out."""
    results = run(fn, list(tensors), [t.dtype for t in tensors], op_name=op_name)
    for result, t in zip(results, tensors):
        result.set_shape(t.shape)
    return results


def _sparsified(policy: GradientPolicy, grads: Sequence[tf.Tensor | tf.IndexedSlices | None], chosen: list[int],
                names: Sequence[str], scale: float) -> list[tf.Tensor]:
    """Exchange the chosen gradients through the compressor's own exchange (sparsified pairs or
    PowerSGD factors)."""
    dense = [tf.convert_to_tensor(grads[i]) for i in chosen]
    chosen_names = [str(names[i]) for i in chosen]
    group = gradient_group_name(chosen_names)

    def exchange(*arrays: np.ndarray) -> list[np.ndarray]:
        return self_reduced_allreduce(policy.compression, arrays, chosen_names, group, policy.process_set,
                                      scale)

    return run_on_arrays(exchange, dense, f"UnisonSparsified_{group}")
