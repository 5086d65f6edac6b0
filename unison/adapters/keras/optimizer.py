"""DistributedOptimizer for Keras 3: the user's optimizer instance, reducing gradients across ranks before it applies them.

(A Keras 2 optimizer given to `DistributedOptimizer` goes to `unison.adapters.tf_keras.optimizer`.)

The wrapper never rebuilds the optimizer from its config (Horovod's `from_config` broke learning-rate
schedules and custom optimizers). It swaps the instance's class for a subclass of its own class with
the same name and module, so `isinstance`, schedules, slots and saving keep working, and a saved model
reloads with plain Keras. Gradients are reduced at one point, `apply` (which `apply_gradients` and
`model.fit` on the TensorFlow and torch backends call), before loss-scale unscaling, clipping and
weight decay: so clipping sees the global gradient, as in a single-process run.

With a sparsifier (``Compression.topk``/``threshold``) the gradients travel as (index, value) pairs by
allgather with error feedback; with ``Compression.powersgd`` as low-rank factors (two allreduces)
with error feedback; with ``Compression.partial`` no gradient is reduced and, after each
apply, one rotating slice of the trainable variables is averaged across ranks.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import keras
import numpy as np

from ..._job import collectives as C
from ..._job.gradients import (
    Framework,
    GradientPolicy,
    aggregation_divisor,
    allreduce_scaling,
    gradient_group_name,
    gradient_policy,
    local_divisor,
    self_reduced_scale,
    split_local,
)
from ..._job.runtime import job
from ...compression import Exchange
from ...compression._exchange import self_reduced, self_reduced_allreduce
from ...errors import InvalidArgumentError, UnisonNotImplementedError
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..array_compression import Compression
from .flavour import is_tf_keras_object
from .naming import variable_keys
from .shared import JIT_WARNING, XLA_ERROR, partial_averager, tf_in_xla_context

if TYPE_CHECKING:
    from typing import TypeAlias

    import tensorflow as tf
    import torch

    from ...compression import Compressor

    #: A variable's gradient as the backend makes it (dense or sparse on TensorFlow), or None without one.
    _Gradient: TypeAlias = tf.Tensor | tf.IndexedSlices | torch.Tensor | np.ndarray | None

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed"]

log = logging.getLogger(__name__)

# Keras 3's or Keras 2's optimizer, wrapped in place and returned.
_OptimizerT = TypeVar("_OptimizerT")


class _Layer(Protocol):
    """What `PartialDistributedOptimizer` reads of either Keras's layer: the weights to keep local."""

    @property
    def trainable_weights(self) -> Sequence[object]: ...


# Keras 2 arguments of Model.compile that Horovod's examples pass and Keras 3 refuses; dropped once
# with a warning each, since they never changed the result (TF 2.0-2.3 needed them for the wrapper).
_KERAS2_COMPILE_ARGUMENTS = ("experimental_run_tf_function",)
_warned_arguments: set[str] = set()


def _drop_keras2_arguments(kwargs: dict[str, object]) -> None:
    """Remove Keras 2-only compile arguments from `kwargs`, warning once per argument and process."""
    for name in _KERAS2_COMPILE_ARGUMENTS:
        if name not in kwargs:
            continue
        value = kwargs.pop(name)
        if name not in _warned_arguments:
            _warned_arguments.add(name)
            warnings.warn(
                f"unison: model.compile({name}={value!r}) is a Keras 2 argument that Keras 3 does not "
                f"accept; unison drops it (it changes nothing with unison's DistributedOptimizer). "
                f"Remove it from the call to silence this warning.", UserWarning, stacklevel=3)


def _backend() -> str:
    return keras.backend.backend()


def _in_xla_context() -> bool:
    return _backend() == "tensorflow" and tf_in_xla_context()


def _executing_eagerly() -> bool:
    if _backend() != "tensorflow":
        return True
    import tensorflow as tf

    return tf.executing_eagerly()


class _Settings:
    """The wrapper's policy and state; a plain object so Keras does not track (or save) its variables."""

    def __init__(self, policy: GradientPolicy) -> None:
        self.policy = policy
        self.local_paths: set[str] = set()
        self.accumulators: list[keras.Variable] | None = None
        self.counter: Any = None  # a keras.Variable once made (Any: read unchecked where accumulating)
        self.statistics = {"apply_calls": 0, "reductions": 0, "dense_bytes": 0, "payload_bytes": 0}


def _names(variables: Sequence[object]) -> list[str]:
    return [str(getattr(v, "path", None) or getattr(v, "name", f"var{i}")) for i, v in enumerate(variables)]


def _reduce(settings: _Settings, grads: list[_Gradient], variables: list[keras.Variable]) -> list[_Gradient]:
    """Reduce a step's gradients in one grouped collective on whatever backend Keras runs."""
    settings.statistics["reductions"] += 1
    local = [n in settings.local_paths for n in _names(variables)]
    names = variable_keys(variables)  # the same on every rank, loaded model or fresh (see naming.py)
    backend = _backend()
    if backend == "tensorflow":
        from ..tensorflow.gradients import reduce_gradients

        return reduce_gradients(settings.policy, grads, names, local)
    if backend in ("torch", "numpy"):
        return _reduce_via_numpy(settings, grads, names, local)
    raise UnisonNotImplementedError(
        f"unison's Keras DistributedOptimizer supports the tensorflow and torch backends. "
        f"Got KERAS_BACKEND={backend!r}."
    )


# Any: the gradients read here are the ones not None, which the indices pick, not the types.
def _reduce_via_numpy(settings: _Settings, grads: list[Any], names: list[str],
                      local: list[bool]) -> list[Any]:
    policy = settings.policy
    current = job()
    size = len(current.set_members(policy.process_set.process_set_id or 0) or ()) or current.size
    out = list(grads)
    chosen, kept = split_local([g is not None for g in grads], local)
    divisor = local_divisor(policy, size)
    for i in kept:
        if divisor is not None:
            out[i] = grads[i] / divisor
    if not chosen:
        return out
    if self_reduced(policy.compression):
        arrays = [np.ascontiguousarray(keras.ops.convert_to_numpy(grads[i])) for i in chosen]
        summed = self_reduced_allreduce(policy.compression, arrays, [names[i] for i in chosen],
                                        gradient_group_name([names[i] for i in chosen]),
                                        policy.process_set, self_reduced_scale(policy, size))
        for i, r in zip(chosen, summed):
            out[i] = keras.ops.convert_to_tensor(r, dtype=keras.backend.standardize_dtype(grads[i].dtype))
        return out
    arrays, contexts = [], []
    for i in chosen:
        array, ctx = policy.compression.compress(np.ascontiguousarray(keras.ops.convert_to_numpy(grads[i])))
        arrays.append(array)
        contexts.append(ctx)
    op, prescale, postscale = allreduce_scaling(policy)
    reduced = C.grouped_allreduce(arrays, name=gradient_group_name([names[i] for i in chosen]), op=op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=policy.process_set)
    settings.statistics["dense_bytes"] += sum(np.asarray(keras.ops.convert_to_numpy(grads[i])).nbytes
                                              for i in chosen)
    settings.statistics["payload_bytes"] += sum(a.nbytes for a in arrays)
    for i, r, ctx in zip(chosen, reduced, contexts):
        r = np.reshape(r, arrays[chosen.index(i)].shape)
        out[i] = keras.ops.convert_to_tensor(policy.compression.decompress(r, ctx),
                                             dtype=keras.backend.standardize_dtype(grads[i].dtype))
    return out


def _average_partial(settings: _Settings, variables: list[keras.Variable]) -> None:
    """Average this step's rotating slice of `variables` across the ranks (partial synchronization)."""
    average = partial_averager(settings.policy, variables)
    if _backend() == "tensorflow":
        from ..tensorflow.gradients import run_on_arrays

        results = run_on_arrays(average, [v.value for v in variables], op_name="UnisonPartialSync")
    else:
        results = average(*[keras.ops.convert_to_numpy(v.value) for v in variables])
    for v, r in zip(variables, results):
        v.assign(r)


def _install_compile_hook() -> None:
    """Once per process: wrap `Model.compile` to drop Keras 2 arguments and to turn XLA off for wrapped optimizers.

    Keras resolves ``jit_compile`` at compile time and the optimizer is often first built inside the
    traced step, too late to switch; so the check runs right after compile (with one warning). It
    acts only on models whose optimizer (or the inner optimizer of a LossScaleOptimizer) is wrapped
    by unison. Before compile, Keras 2's ``experimental_run_tf_function`` is dropped (with a
    warning once per process): Horovod's Keras examples pass it. The hook is installed when this
    module is imported, because ``model.compile(optimizer=hvd.DistributedOptimizer(...), ...)``
    looks up ``compile`` before it wraps the optimizer.
    """
    from keras.src.trainers.trainer import Trainer

    if getattr(Trainer.compile, "_unison_hook", False):
        return
    original = Trainer.compile

    @functools.wraps(original)
    def compile(self: keras.Model, *args: object, **kwargs: object) -> None:
        _drop_keras2_arguments(kwargs)
        result = original(self, *args, **kwargs)
        optimizer = getattr(self, "optimizer", None)
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if _backend() == "tensorflow" and is_distributed(inner) and self.jit_compile:
            warnings.warn(JIT_WARNING, UserWarning, stacklevel=2)
            self.jit_compile = False
        return result

    compile._unison_hook = True  # type: ignore[attr-defined]
    Trainer.compile = compile


_install_compile_hook()


class _DistributedMixin:
    """Placed before the optimizer's own class in the wrapped instance's MRO."""

    _unison: _Settings

    def build(self, variables: list[keras.Variable]) -> None:
        super().build(variables)  # type: ignore[misc]
        self._create_accumulators()

    def _create_accumulators(self) -> None:
        settings = self._unison
        if settings.policy.backward_passes_per_step > 1 and settings.accumulators is None:
            settings.accumulators = [
                keras.Variable(np.zeros(v.shape, dtype=keras.backend.standardize_dtype(v.dtype)),
                               trainable=False, name="unison_accumulator")
                for v in self._trainable_variables  # type: ignore[attr-defined]
            ]
            settings.counter = keras.Variable(0, dtype="int64", trainable=False, name="unison_counter")

    def register_local_var(self, var: keras.Variable) -> None:
        """Keep `var`'s gradient local: not reduced (scaled by 1/size if scale_local_gradients)."""
        self._unison.local_paths.add(_names([var])[0])

    def statistics(self) -> dict[str, int]:
        """Counters: apply calls, gradient reductions, this rank's bytes before (``dense_bytes``) and
        after (``payload_bytes``) compression. A stateful scheme counts its own bytes as they are
        sent (inside compiled steps too); a cast's bytes are counted on the torch backend only."""
        out = dict(self._unison.statistics)
        counted = getattr(self._unison.policy.compression, "statistics", None)
        if callable(counted):
            own = counted()
            out["dense_bytes"], out["payload_bytes"] = own["dense_bytes"], own["payload_bytes"]
        return out

    def apply(self, grads: Iterable[_Gradient],
              trainable_variables: Sequence[keras.Variable] | None = None) -> keras.Variable | None:
        settings = self._unison
        settings.statistics["apply_calls"] += 1
        if _in_xla_context():
            raise InvalidArgumentError(XLA_ERROR)
        base_apply = super().apply  # type: ignore[misc]
        grads = list(grads)
        if trainable_variables is None:
            variables = list(self._trainable_variables)  # type: ignore[attr-defined]
        else:
            variables = list(trainable_variables)
        if settings.policy.exchange is Exchange.PARTIAL:
            result = base_apply(grads, trainable_variables)
            _average_partial(settings, variables)
            return result
        if settings.policy.backward_passes_per_step == 1:
            return base_apply(_reduce(settings, grads, variables), trainable_variables)
        if not self.built:  # type: ignore[attr-defined,has-type]
            with keras.name_scope(self.name, caller=self):  # type: ignore[attr-defined]
                self.build(variables)
            self.built = True
        return self._aggregated_apply(base_apply, grads, variables, trainable_variables)

    def _aggregated_apply(self, base_apply: Callable[..., object], grads: list[_Gradient],
                          variables: list[keras.Variable],
                          trainable_variables: Sequence[keras.Variable] | None) -> keras.Variable:
        settings = self._unison
        steps = settings.policy.backward_passes_per_step
        if _backend() == "tensorflow":
            import tensorflow as tf

            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        accumulators = [settings.accumulators[self._get_variable_index(v)] for v in variables]  # type: ignore[index, attr-defined]
        settings.counter.assign_add(1)
        is_update = keras.ops.equal(keras.ops.mod(settings.counter.value, steps), 0)

        def update() -> None:
            totals = [None if g is None else g + a.value for g, a in zip(grads, accumulators)]
            divisor = aggregation_divisor(settings.policy)
            if divisor is not None:
                totals = [None if t is None else t / divisor for t in totals]
            base_apply(_reduce(settings, totals, variables), trainable_variables)
            for a in accumulators:
                a.assign(keras.ops.zeros_like(a.value))

        def accumulate() -> None:
            for g, a in zip(grads, accumulators):
                if g is not None:
                    a.assign_add(g)
            self.iterations.assign_add(1)  # type: ignore[attr-defined]

        if _executing_eagerly():
            (update if bool(keras.ops.convert_to_numpy(is_update)) else accumulate)()
        else:
            keras.ops.cond(is_update, update, accumulate)
        return self.iterations  # type: ignore[attr-defined]


def is_distributed(optimizer: object) -> bool:
    """True if `optimizer` (Keras 3's or Keras 2's) was wrapped by `DistributedOptimizer`."""
    if is_tf_keras_object(optimizer):
        from ..tf_keras.optimizer import is_distributed as keras2_is_distributed

        return keras2_is_distributed(optimizer)
    return isinstance(optimizer, _DistributedMixin)


def DistributedOptimizer(optimizer: _OptimizerT, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "",
                         compression: type[Compressor] | Compressor = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp | int = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: int | Sequence[Sequence[object]] | None = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> _OptimizerT:
    """Make a Keras optimizer reduce gradients across ranks before applying them; return it.

    The instance itself is wrapped (its class becomes a same-named subclass), so learning-rate
    schedules, custom optimizers and its saved form are unchanged. With
    ``backward_passes_per_step=N`` gradients are summed locally for N calls (averaged if
    `average_aggregated_gradients`) and reduced and applied on every N-th; the calls in between
    only advance ``optimizer.iterations``. Works with ``KERAS_BACKEND=tensorflow`` and ``torch``.
    A Keras 2 optimizer (tf_keras, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``) goes to
    `unison.adapters.tf_keras.optimizer.DistributedOptimizer`, which wraps it the same way.

    Example:
        >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))   # doctest: +SKIP
        >>> model.compile(optimizer=opt, loss="mse")                                     # doctest: +SKIP
    """
    if is_tf_keras_object(optimizer):
        from ..tf_keras import optimizer as keras2

        return keras2.DistributedOptimizer(
            optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
            gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
            num_groups, groups, process_set, scale_local_gradients)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise InvalidArgumentError(
            f"DistributedOptimizer wraps a Keras optimizer: Keras 3's (keras.optimizers.Optimizer), or "
            f"Keras 2's (tf.keras.optimizers.* and tf.keras.optimizers.legacy.* under "
            f"TF_USE_LEGACY_KERAS=1 with tf-keras installed). Got {type(optimizer).__name__} "
            f"from {type(optimizer).__module__}."
        )
    if is_distributed(optimizer):
        raise InvalidArgumentError("This optimizer is already wrapped by DistributedOptimizer.")
    # Keras accepts any integral value here (2.0, numpy integers), as it did before the core
    policy = gradient_policy(Framework.KERAS, op=op, compression=compression,
                             sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor,
                             backward_passes_per_step=int(backward_passes_per_step),
                             average_aggregated_gradients=average_aggregated_gradients,
                             process_set=process_set, scale_local_gradients=scale_local_gradients)
    settings = _Settings(policy)
    cls = type(optimizer)
    attrs: dict[str, object] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if _backend() == "tensorflow":
        import tensorflow as tf

        # Inside a user's tf.function, AutoGraph must not rewrite the wrapper's Python control flow.
        attrs["apply"] = tf.autograph.experimental.do_not_convert(_DistributedMixin.apply)
    wrapped = type(cls.__name__, (_DistributedMixin, cls), attrs)
    # object.__setattr__: Keras's tracker must not see the settings object.
    object.__setattr__(optimizer, "_unison", settings)
    optimizer.__class__ = wrapped
    _install_compile_hook()
    if settings.policy.backward_passes_per_step > 1 and optimizer.built:
        optimizer._create_accumulators()
    return optimizer


def PartialDistributedOptimizer(optimizer: _OptimizerT, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "",
                                compression: type[Compressor] | Compressor = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: ReduceOp | int = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False,
                                groups: int | Sequence[Sequence[object]] | None = None,
                                process_set: ProcessSet = global_process_set,
                                local_layers: _Layer | list[_Layer] | tuple[_Layer, ...] | None = None,
                                scale_local_gradients: bool = True) -> _OptimizerT:
    """A DistributedOptimizer whose `local_layers`' trainable weights keep local gradients."""
    # Any: the wrapper's methods (register_local_var) are on it now, which _OptimizerT does not say.
    wrapped: Any = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                                        sparse_as_dense, gradient_predivide_factor, op,
                                        backward_passes_per_step, average_aggregated_gradients, 0, groups,
                                        process_set, scale_local_gradients)
    layers = [] if local_layers is None else (
        local_layers if isinstance(local_layers, (list, tuple)) else [local_layers])
    for layer in layers:
        for weight in layer.trainable_weights:
            wrapped.register_local_var(weight)
    return wrapped
