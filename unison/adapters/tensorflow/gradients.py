"""Reduce a step's gradients in one grouped collective: the shared core of DistributedGradientTape and the Keras optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ...compression import Exchange
from ...compression._exchange import self_reduced, self_reduced_allreduce
from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ._bridge import graph_name, run
from ._bridge import no_autograph as _no_autograph
from ._policy import gradient_group_name
from .collectives import grouped_allreduce, set_size
from .compression import Compression

__all__ = ["reduce_gradients"]


@_no_autograph
def reduce_gradients(grads: Sequence[Any], names: Sequence[str], *, op: ReduceOp = ReduceOp.AVERAGE,
                     compression: Any = Compression.none, sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set, local: Sequence[bool] = (),
                     scale_local_gradients: bool = True) -> list[Any]:
    """Return `grads` reduced across the set in one grouped allreduce (None entries stay None).

    `names` (one per gradient, usually the variable names) fix the group's name, so every rank agrees
    on it and the engine's response cache recognises the same step. Gradients flagged in `local`
    are not reduced; with `scale_local_gradients` they are divided by the set size, as Horovod does.
    """
    grads = list(grads)
    size = set_size(process_set)
    local_flags = list(local) or [False] * len(grads)
    chosen = [i for i, g in enumerate(grads) if g is not None and not local_flags[i]]
    out = list(grads)
    for i, g in enumerate(grads):
        if g is not None and local_flags[i] and scale_local_gradients and size > 1:
            out[i] = g / tf.cast(size, g.dtype)
    if not chosen:
        return out
    if sparse_as_dense:
        for i in chosen:
            if isinstance(grads[i], tf.IndexedSlices):
                grads[i] = tf.convert_to_tensor(grads[i])
    prescale, postscale = 1.0, 1.0
    if gradient_predivide_factor != 1.0:
        op = ReduceOp.SUM
        prescale = 1.0 / gradient_predivide_factor
        postscale = gradient_predivide_factor / size
    exchange = Exchange(getattr(compression, "exchange", Exchange.ALLREDUCE))
    if self_reduced(compression):
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise InvalidArgumentError(
                f"compression={compression!r} supports op=Average and op=Sum. Got op={op.name}."
            )
        scale = prescale * postscale * (1.0 / size if op is ReduceOp.AVERAGE else 1.0)
        for i, r in zip(chosen, _sparsified(grads, chosen, names, compression, process_set, scale)):
            out[i] = r
        return out
    if exchange is not Exchange.ALLREDUCE:
        raise InvalidArgumentError(
            f"compression={compression!r} cannot reduce gradients here; partial synchronization works "
            "with the Keras DistributedOptimizer on the torch backend."
        )
    name = graph_name("DistributedGradients", gradient_group_name([names[i] for i in chosen]))
    reduced = grouped_allreduce([grads[i] for i in chosen], op=op, compression=compression,
                                prescale_factor=prescale, postscale_factor=postscale,
                                process_set=process_set, name=name)
    for i, r in zip(chosen, reduced):
        out[i] = r
    return out


def _sparsified(grads: list[Any], chosen: list[int], names: Sequence[str], compression: Any,
                process_set: ProcessSet, scale: float) -> list[Any]:
    """Exchange the chosen gradients through the compressor's own exchange (sparsified pairs or
    PowerSGD factors): eagerly, or as one numpy_function op."""
    dense = [tf.convert_to_tensor(grads[i]) for i in chosen]
    chosen_names = [str(names[i]) for i in chosen]
    group = gradient_group_name(chosen_names)

    def exchange(*arrays: Any) -> list[Any]:
        return self_reduced_allreduce(compression, arrays, chosen_names, group, process_set, scale)

    results = run(exchange, dense, [d.dtype for d in dense], op_name=f"UnisonSparsified_{group}")
    for result, d in zip(results, dense):
        result.set_shape(d.shape)
    return results
