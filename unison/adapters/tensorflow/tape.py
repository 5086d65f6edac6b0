"""DistributedGradientTape: a tf.GradientTape whose gradient() returns gradients reduced across ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from ..._job.gradients import Framework, GradientPolicy, gradient_policy
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..array_compression import Compression
from ._bridge import no_autograph as _no_autograph
from .gradients import reduce_gradients

if TYPE_CHECKING:
    from ...compression import Compressor

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedGradientTape(tf.GradientTape):
    """Shares the recorded tape of the wrapped one; `gradient` reduces before returning."""

    def __init__(self, tape: tf.GradientTape, policy: GradientPolicy) -> None:
        # No super().__init__: this object takes over the wrapped tape's state (its recording).
        self.__dict__.update(tape.__dict__)
        self._unison = policy
        self._local_refs: set[int] = set()
        self._statistics = {"gradient_calls": 0, "tensors_reduced": 0}

    def __repr__(self) -> str:
        return (f"DistributedGradientTape(op={self._unison.op.name}, "
                f"local_variables={len(self._local_refs)}, calls={self._statistics['gradient_calls']})")

    def statistics(self) -> dict[str, int]:
        """Counters: gradient() calls and gradients handed to the reduction."""
        return dict(self._statistics)

    def register_local_source(self, source: tf.Variable) -> None:
        """Keep `source`'s gradient local (not reduced; scaled by 1/size if scale_local_gradients)."""
        self._local_refs.add(id(source))

    # Returns Any: gradients nested like `sources` (tf.nest has no type for a nest).
    @_no_autograph
    def gradient(self, target: object, sources: object, output_gradients: object = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE,
                 use_generic_names: bool = False) -> Any:
        """The gradients of `target`, reduced across ranks (local sources' kept, see the class).

        `use_generic_names` is accepted for Horovod compatibility: the group is always named after
        the sources, the same on every rank.
        """
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        names = [getattr(s, "path", None) or getattr(s, "name", f"source{i}")
                 for i, s in enumerate(flat_sources)]
        local = [id(s) in self._local_refs for s in flat_sources]
        self._statistics["gradient_calls"] += 1
        self._statistics["tensors_reduced"] += sum(g is not None for g in flat_grads)
        reduced = reduce_gradients(self._unison, flat_grads, names, local)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target: object, sources: Sequence[tf.Variable],
                                       output_gradients: object = None, use_generic_names: bool = False
                                       ) -> tuple[list[tuple[tf.Variable, Any]], list[tuple[tf.Variable, Any]]]:
        """`gradient()`, split into ``(source, gradient)`` pairs of local sources and of the others.

        Example:
            >>> local, shared = tape.get_local_and_global_gradients(loss, model.trainable_weights)  # doctest: +SKIP
        """
        sources = list(sources)
        grads = self.gradient(target, sources, output_gradients, use_generic_names=use_generic_names)
        local: list[tuple[tf.Variable, Any]] = []
        shared: list[tuple[tf.Variable, Any]] = []
        for source, grad in zip(sources, grads):
            (local if id(source) in self._local_refs else shared).append((source, grad))
        return local, shared


@_no_autograph
def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: Compressor | type[Compressor] = Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp = ReduceOp.AVERAGE,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: int | Sequence[Sequence[tf.Variable]] | None = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wrap a recorded tape so that `gradient()` averages (or sums) the gradients across ranks.

    All of a call's gradients go to the engine as one group (`num_groups`/`groups` are accepted for
    Horovod compatibility; one group is what makes the reduction fast here).

    Example:
        >>> with tf.GradientTape() as tape:              # doctest: +SKIP
        ...     loss = loss_fn(model(x), y)
        >>> tape = hvd.DistributedGradientTape(tape)
        >>> grads = tape.gradient(loss, model.trainable_variables)
    """
    policy = gradient_policy(Framework.TENSORFLOW, op=op, compression=compression,
                             sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
                             scale_local_gradients=scale_local_gradients)
    return _DistributedGradientTape(gradtape, policy)


@_no_autograph
def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: Compressor | type[Compressor] = Compression.none,
                                   sparse_as_dense: bool = False, op: ReduceOp = ReduceOp.AVERAGE,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: int | Sequence[Sequence[tf.Variable]] | None = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: tf.keras.layers.Layer | Sequence[tf.keras.layers.Layer] | None = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """A DistributedGradientTape whose `local_layers`' trainable weights keep local gradients."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense,
                                   op, gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    layers = [] if local_layers is None else (
        local_layers if isinstance(local_layers, Sequence) else [local_layers])
    for layer in layers:
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape
