"""DistributedOptimizer for Keras 2 (tf_keras): the user's optimizer instance, reducing gradients before it applies them.

The same design as the Keras 3 wrapper (`unison.adapters.keras.optimizer`): the instance's class
becomes a same-named subclass of its own class, so `isinstance`, schedules, slots, ``opt.lr`` and
saving keep working, and a saved model reloads with plain tf_keras. It wraps tf_keras's optimizers
(``tf.keras.optimizers.Adam``) and its legacy ones (``tf.keras.optimizers.legacy.Adam``, which take
``lr=``). Gradients are reduced once per step, before clipping and weight decay, so clipping sees
the global gradient: in ``_compute_gradients`` (a legacy optimizer's, which its ``minimize`` and
``model.fit`` call) or ``compute_gradients`` (tf_keras's own optimizers'), as Horovod's wrapper
does, and otherwise in ``apply_gradients``, which leaves alone the gradients those returned. With
``backward_passes_per_step`` above one they are summed and reduced in ``apply_gradients``, every
N-th call.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import tensorflow as tf

from ..._job.gradients import (
    Framework,
    GradientPolicy,
    aggregation_divisor,
    gradient_policy,
)
from ...compression import Exchange
from ...errors import InvalidArgumentError
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..array_compression import Compression
from ..keras.naming import variable_keys
from ..keras.shared import JIT_WARNING, XLA_ERROR, partial_averager, tf_in_xla_context
from ..tensorflow.gradients import reduce_gradients, run_on_arrays

if TYPE_CHECKING:
    from typing import TypeAlias

    import tf_keras

    from ...compression import Compressor

    #: tf_keras's optimizers: its own, and its legacy ones (``tf.keras.optimizers.legacy.*``).
    Keras2Optimizer: TypeAlias = tf_keras.optimizers.Optimizer | tf_keras.optimizers.legacy.Optimizer
    #: A variable's gradient: dense, sparse (an embedding's), or None when the loss does not depend on it.
    _Gradient: TypeAlias = tf.Tensor | tf.IndexedSlices | None

__all__ = ["DistributedOptimizer", "install_compile_hook", "is_distributed", "is_keras2_optimizer"]

# A Keras 2 optimizer, wrapped in place and returned.
_OptimizerT = TypeVar("_OptimizerT")


def is_keras2_optimizer(optimizer: object) -> bool:
    """True for tf_keras's optimizers, new and legacy (``tf.keras.optimizers[.legacy].*`` under Keras 2)."""
    import tf_keras

    return isinstance(optimizer, (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer))


class _Settings:
    """The wrapper's policy and state; a plain object so tf_keras does not track (or save) its variables."""

    def __init__(self, policy: GradientPolicy) -> None:
        self.policy = policy
        self.local_refs: set[Hashable] = set()  # the variables' ref(): two tf.Variables may share a name
        self.accumulators: dict[Hashable, tf.Variable] = {}  # by the variable's ref()
        # The passes summed since the last update (0 to N-1); Horovod's `_agg_helper.counter`.
        self.counter: tf.Variable | None = None
        # The gradients the last compute_gradients returned reduced, by id: apply_gradients keeps them.
        self.reduced: dict[int, object] = {}
        self.statistics = {"apply_calls": 0, "reductions": 0, "dense_bytes": 0, "payload_bytes": 0}


def _build(optimizer: Keras2Optimizer, variables: list[tf.Variable]) -> None:
    """Make the optimizer's slots now (outside any branch): tf_keras's `build`, or a legacy optimizer's own."""
    with tf.init_scope():
        if hasattr(optimizer, "_create_all_weights"):
            optimizer._create_all_weights(variables)
        else:
            optimizer.build(variables)


def _average_partial(settings: _Settings, variables: list[tf.Variable]) -> None:
    """Average this step's rotating slice of `variables` across the ranks (partial synchronization)."""
    average = partial_averager(settings.policy, variables)
    results = run_on_arrays(average, [v.read_value() for v in variables], op_name="UnisonPartialSync")
    for v, r in zip(variables, results):
        v.assign(r)


class _DistributedMixin:
    """Placed before the optimizer's own class in the wrapped instance's MRO."""

    _unison: _Settings

    @property
    def _agg_helper(self) -> _Settings | None:
        """Horovod's name for the aggregation state (None with one pass per step): its ``counter``
        holds the passes summed since the last update."""
        return self._unison if self._unison.policy.backward_passes_per_step > 1 else None

    def register_local_var(self, var: tf.Variable) -> None:
        """Keep `var`'s gradient local: not reduced (scaled by 1/size if scale_local_gradients)."""
        self._unison.local_refs.add(var.ref())

    def compute_gradients(self, loss: object, var_list: object, tape: tf.GradientTape | None = None
                          ) -> list[tuple[_Gradient, tf.Variable]]:
        """The gradients of `loss`, reduced across ranks (see `_compute_gradients`)."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss: object, var_list: object, grad_loss: object = None,
                           tape: tf.GradientTape | None = None) -> list[tuple[_Gradient, tf.Variable]]:
        """The optimizer's gradients of `loss`, reduced across ranks, as Horovod's wrapper returns them.

        Legacy optimizers' ``minimize`` (and so ``model.fit``) call this; tf_keras's own call
        `compute_gradients`. With ``backward_passes_per_step`` above one they come back as they
        are: `apply_gradients` sums them and reduces every N-th call.
        """
        base: Any = super()  # the optimizer's own class: a legacy one has _compute_gradients
        if hasattr(base, "_compute_gradients"):
            pairs = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        else:
            pairs = base.compute_gradients(loss, var_list, tape=tape)
        settings = self._unison
        if settings.policy.backward_passes_per_step > 1 or settings.policy.exchange is Exchange.PARTIAL:
            return list(pairs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        reduced = self._reduce(grads, variables)
        settings.reduced = {id(g): g for g in reduced if g is not None}
        return list(zip(reduced, variables))

    def _reduced_already(self, grads: Sequence[_Gradient]) -> bool:
        """Whether `grads` are those the last `_compute_gradients` returned reduced (and forget them)."""
        held, self._unison.reduced = self._unison.reduced, {}
        return bool(held) and all(g is None or held.get(id(g)) is g for g in grads)

    def statistics(self) -> dict[str, int]:
        """Counters: apply calls, gradient reductions (each traced or eager call of the step), and,
        with a stateful compression scheme, this rank's bytes before (``dense_bytes``) and after
        (``payload_bytes``) compression, which the scheme counts as they are sent."""
        out = dict(self._unison.statistics)
        counted = getattr(self._unison.policy.compression, "statistics", None)
        if callable(counted):
            own = counted()
            out["dense_bytes"], out["payload_bytes"] = own["dense_bytes"], own["payload_bytes"]
        return out

    def _reduce(self, grads: list[_Gradient], variables: list[tf.Variable]) -> list[_Gradient]:
        settings = self._unison
        settings.statistics["reductions"] += 1
        local = [v.ref() in settings.local_refs for v in variables]
        # Named by place, shape and dtype: the same on every rank, loaded model or fresh (naming.py).
        return reduce_gradients(settings.policy, grads, variable_keys(variables), local)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[_Gradient, tf.Variable]], *args: object,
                        **kwargs: object) -> tf.Variable | tf.Operation:
        settings = self._unison
        settings.statistics["apply_calls"] += 1
        if tf_in_xla_context():
            raise InvalidArgumentError(XLA_ERROR)
        base_apply = super().apply_gradients  # type: ignore[misc]
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if settings.policy.exchange is Exchange.PARTIAL:
            result = base_apply(pairs, *args, **kwargs)
            _average_partial(settings, variables)
            return result
        if settings.policy.backward_passes_per_step == 1:
            if self._reduced_already(grads):
                return base_apply(pairs, *args, **kwargs)
            return base_apply(list(zip(self._reduce(grads, variables), variables)), *args, **kwargs)
        return self._aggregated_apply(base_apply, grads, variables, args, kwargs)

    def _aggregated_apply(self, base_apply: Callable[..., object], grads: list[_Gradient],
                          variables: list[tf.Variable], args: tuple[object, ...],
                          kwargs: dict[str, object]) -> tf.Variable:
        settings = self._unison
        steps = settings.policy.backward_passes_per_step
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        _build(self, variables)
        with tf.init_scope():
            for v in variables:
                if v.ref() not in settings.accumulators:
                    settings.accumulators[v.ref()] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                                 name="unison_accumulator")
            if settings.counter is None:
                settings.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="unison_counter")
        accumulators = [settings.accumulators[v.ref()] for v in variables]
        counter = settings.counter
        counter.assign_add(1)
        is_update = tf.greater_equal(counter.read_value(), steps)
        iterations = self.iterations  # type: ignore[attr-defined]

        def update() -> tf.Tensor:
            totals = [None if g is None else g + a.read_value() for g, a in zip(grads, accumulators)]
            divisor = aggregation_divisor(settings.policy)
            if divisor is not None:
                totals = [None if t is None else t / tf.cast(divisor, t.dtype) for t in totals]
            base_apply(list(zip(self._reduce(totals, variables), variables)), *args, **kwargs)
            for a in accumulators:
                a.assign(tf.zeros_like(a))
            counter.assign(0)
            return tf.constant(True)

        def accumulate() -> tf.Tensor:
            for g, a in zip(grads, accumulators):
                if g is not None:
                    a.assign_add(g)
            iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            (update if bool(is_update.numpy()) else accumulate)()
        else:
            tf.cond(is_update, update, accumulate)
        return iterations


def is_distributed(optimizer: object) -> bool:
    """True if `optimizer` is a Keras 2 optimizer wrapped by `DistributedOptimizer`."""
    return isinstance(optimizer, _DistributedMixin)


def install_compile_hook() -> None:
    """Once per process: wrap tf_keras's `Model.compile` to turn XLA off for models with a wrapped optimizer.

    tf_keras compiles the step with XLA only when asked (``jit_compile=True``); the reduction runs in
    Python, so the hook switches it off with one warning, as unison's Keras 3 hook does. It is
    installed when the Keras 2 modules are imported, because ``model.compile(optimizer=
    hvd.DistributedOptimizer(...))`` looks up ``compile`` before it wraps the optimizer.
    """
    import tf_keras

    model_class = tf_keras.Model
    if getattr(model_class.compile, "_unison_hook", False):
        return
    original = model_class.compile

    @functools.wraps(original)
    def compile(self: tf_keras.Model, *args: object, **kwargs: object) -> None:
        result = original(self, *args, **kwargs)
        optimizer = getattr(self, "optimizer", None)
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if is_distributed(inner) and self.jit_compile:
            warnings.warn(JIT_WARNING, UserWarning, stacklevel=2)
            self.jit_compile = False
        return result

    compile._unison_hook = True  # type: ignore[attr-defined]
    model_class.compile = compile


def DistributedOptimizer(optimizer: _OptimizerT, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "",
                         compression: type[Compressor] | Compressor = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp | int = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: int | Sequence[Sequence[object]] | None = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> _OptimizerT:
    """Make a Keras 2 (tf_keras) optimizer reduce gradients across ranks before applying them; return it.

    Called through ``hvd.DistributedOptimizer`` of any unison module when the optimizer is tf_keras's.
    ``backward_passes_per_step=N`` sums N passes locally (averaged if
    `average_aggregated_gradients`), then reduces and applies; the calls in between only advance
    ``optimizer.iterations``.

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(lr=0.01 * hvd.size()))   # doctest: +SKIP
    """
    if not is_keras2_optimizer(optimizer):
        raise InvalidArgumentError(
            f"This DistributedOptimizer wraps Keras 2 (tf_keras) optimizers. Got {type(optimizer).__name__}."
        )
    if is_distributed(optimizer):
        raise InvalidArgumentError("This optimizer is already wrapped by DistributedOptimizer.")
    policy = gradient_policy(Framework.KERAS, op=op, compression=compression,
                             sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor,
                             backward_passes_per_step=int(backward_passes_per_step),
                             average_aggregated_gradients=average_aggregated_gradients,
                             process_set=process_set, scale_local_gradients=scale_local_gradients)
    cls = type(optimizer)
    attrs: dict[str, object] = {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        # Inside a user's tf.function, AutoGraph must not rewrite the wrapper's Python control flow.
        "apply_gradients": tf.autograph.experimental.do_not_convert(_DistributedMixin.apply_gradients),
        "compute_gradients": tf.autograph.experimental.do_not_convert(_DistributedMixin.compute_gradients),
        "_compute_gradients": tf.autograph.experimental.do_not_convert(_DistributedMixin._compute_gradients),
    }
    wrapped = type(cls.__name__, (_DistributedMixin, cls), attrs)
    # object.__setattr__: tf_keras's tracking (and a legacy optimizer's hyperparameter setter) must not see it.
    object.__setattr__(optimizer, "_unison", _Settings(policy))
    optimizer.__class__ = wrapped
    install_compile_hook()
    return optimizer
