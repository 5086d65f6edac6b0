"""Run a NumPy-level collective on TensorFlow tensors: directly when eager, as one stateful op in graphs.

Three rules make graph execution safe across ranks. Every bridge op is *stateful*, so inside a
`tf.function` TensorFlow's automatic control dependencies run them in program order on every rank
(no rank can block in collective B while its peer waits in A). A ``tf.compat.v1`` graph run by
``Session.run`` has no such order, so there a collective waits off the executor's thread pool
(`_off_pool`), and any number of independent collectives complete in whatever order each rank's
executor starts them. And graph-mode names are fixed when the graph is built, from the input
tensor's name and the graph's own unique-name counter, which are the same on every rank that builds
the same code; a fixed name also lets the engine's response cache skip negotiation from the second
step on.

Errors: unison errors surface as the `tf.errors` types Horovod's TensorFlow ops raise (mismatches
as `FailedPreconditionError`, bad arguments as `InvalidArgumentError`, shutdown as `UnknownError`).
Eagerly the raised object is also an instance of the unison error, so either handler works. In a
graph TensorFlow would turn an exception escaping the Python kernel into `UnknownError`, so the
kernel files it instead and a status op fails with its code and message (`_status_op`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from ...engine.handles import for_a_graph
from ...errors import (
    AbortedError,
    HorovodInternalError,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    ShutdownError,
    UnisonError,
    UnisonNotImplementedError,
)
from . import _status_op
from ._gpu import route_for, run_on_device

if TYPE_CHECKING:
    import numpy.typing as npt

    from ...gpu.device import Array

__all__ = ["executing_eagerly", "graph_name", "no_autograph", "run", "to_tf_error"]

# Library code runs as written inside tf.function: AutoGraph must not rewrite its Python control flow.
no_autograph = tf.autograph.experimental.do_not_convert

# unison error class -> tf.errors class Horovod's kernels raise for it (first match wins)
_TF_ERROR_FOR: tuple[tuple[type[Exception], type[tf.errors.OpError]], ...] = (
    (MismatchError, tf.errors.FailedPreconditionError),
    (NotInitializedError, tf.errors.FailedPreconditionError),
    (ShutdownError, tf.errors.UnknownError),
    (AbortedError, tf.errors.AbortedError),
    (InvalidArgumentError, tf.errors.InvalidArgumentError),
    (UnisonNotImplementedError, tf.errors.UnimplementedError),
    (HorovodInternalError, tf.errors.UnknownError),
)


@functools.cache
def _combined(unison_cls: type[Exception], tf_cls: type[tf.errors.OpError]) -> type[Exception]:
    """A class that is both the tf.errors type and the unison error type."""
    return type(unison_cls.__name__, (tf_cls, unison_cls), {"__module__": __name__})


def _tf_class(error: Exception) -> type[tf.errors.OpError] | None:
    for unison_cls, tf_cls in _TF_ERROR_FOR:
        if isinstance(error, unison_cls):
            return tf_cls
    return None


def to_tf_error(error: Exception) -> Exception:
    """Return the `tf.errors` equivalent of a unison error (unchanged if it is not one)."""
    if not isinstance(error, UnisonError) or isinstance(error, tf.errors.OpError):
        return error
    tf_cls = _tf_class(error)
    if tf_cls is None:
        return error
    return _combined(type(error), tf_cls)(None, None, str(error))  # type: ignore[arg-type]


def _error_code(error: Exception) -> int:
    """The `tf.errors` code a graph op fails with for `error` (Unknown where none is mapped)."""
    tf_cls = _tf_class(error) or tf.errors.UnknownError
    return int(tf_cls(None, None, "").error_code)  # type: ignore[arg-type]


def executing_eagerly() -> bool:
    """True when ops run now (eager), False while a graph is being traced."""
    return tf.executing_eagerly()


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def graph_name(prefix: str, name: str | None, tensor: object = None, ignore_name_scope: bool = False) -> str | None:
    """The collective's name: None (engine default) eagerly without a name, else a name fixed at trace.

    In a graph, the default is ``<prefix>_<input tensor name>`` as in Horovod, made unique in the
    graph (``_1``, ``_2`` ...) and prefixed by the current name scope unless `ignore_name_scope`.
    """
    if executing_eagerly():
        return name
    if name is None:
        tensor_name = getattr(tensor, "name", None) if tensor is not None else None
        name = prefix if not tensor_name else f"{prefix}_{tensor_name}"
    name = _UNSAFE.sub("_", name.replace(":", "_"))
    graph = tf.compat.v1.get_default_graph()
    unique = graph.unique_name(name, mark_as_used=True)
    if ignore_name_scope:
        unique = unique.rsplit("/", 1)[-1]
    return unique


def _numpy_args(tensors: Sequence[tf.Tensor]) -> list[np.ndarray]:
    return [t.numpy() if hasattr(t, "numpy") else np.asarray(t) for t in tensors]


def _off_pool(graph_fn: Callable[..., list[np.ndarray]], inputs: Sequence[tf.Tensor],
              output_dtypes: Sequence[tf.DType], name: str) -> list[tf.Tensor]:
    """One graph op that calls `graph_fn` off the executor's inter-op thread pool.

    Why: a ``tf.compat.v1`` graph run by ``Session.run`` has no automatic control dependencies, so
    each rank's executor starts independent collectives in an order of its own. A collective run by
    a plain numpy_function holds an inter-op thread until every rank has submitted it. Once every
    thread of one rank waits in a collective its peer has not reached, while every thread of the
    peer waits in another, the ops that would release them are queued behind the blocked ones and
    the step never ends. The pool has as many threads as cores by default (two on a two-core
    machine), so a handful of independent collectives in one graph is enough; no naming or ordering
    on unison's side can prevent it, because the order is the executor's.

    TensorFlow's asynchronous kernels return their thread to the pool while they wait. Here the
    collective is the map function of a one-element dataset, read by ``MakeIterator`` and
    ``IteratorGetNext``, asynchronous kernels that do their work on background threads of their
    own; the map function runs on the iterator's threads too, never on the inter-op pool. So every
    collective of a step gets started on every rank, whatever the pool's size and the order each
    executor picks, and the engine, which pairs collectives by name, completes them all.

    The price is building the iterator every step (about 2 ms on a two-core machine), which is why
    `run` takes this path only where the order is free: inside `tf.function`, automatic control
    dependencies already run stateful ops in program order on every rank.
    """
    if inputs:
        dataset = tf.data.Dataset.from_tensors(tuple(inputs))
    else:
        dataset = tf.data.Dataset.from_tensors(tf.constant(0, tf.int8))

    @no_autograph
    def call(*xs: tf.Tensor) -> tuple[tf.Tensor, ...]:
        args = list(xs) if inputs else []
        results = tf.numpy_function(graph_fn, args, list(output_dtypes), stateful=True)
        return tuple(results) if isinstance(results, (list, tuple)) else (results,)

    # Autotuning and the default rewrites would run for each iterator, that is every step.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False
    dataset = dataset.map(call).with_options(options)
    types = [spec.dtype for spec in dataset.element_spec]
    shapes = [spec.shape for spec in dataset.element_spec]
    with tf.name_scope(name):
        iterator = tf.raw_ops.AnonymousIteratorV3(output_types=types, output_shapes=shapes)
        start = tf.raw_ops.MakeIterator(dataset=tf.data.experimental.to_variant(dataset),
                                        iterator=iterator)
        with tf.control_dependencies([start]):
            return list(tf.raw_ops.IteratorGetNext(iterator=iterator, output_types=types,
                                                   output_shapes=shapes))


def run(fn: Callable[..., Sequence[Array | npt.ArrayLike]], inputs: Sequence[tf.Tensor],
        output_dtypes: Sequence[tf.DType], op_name: str = "UnisonCollective", blocking: bool = True,
        device_path: bool = False) -> list[tf.Tensor]:
    """Call ``fn(*numpy_inputs) -> list of arrays`` on tensors and return tensors of `output_dtypes`.

    Eagerly `fn` runs at once in this thread; with `device_path` (`fn` also takes CuPy arrays), eager
    GPU tensors reach it as CuPy arrays and its results return to the GPU (`_gpu.route_for` decides). Inside `tf.function` it becomes one stateful
    numpy_function op. In a ``tf.compat.v1`` graph, an `fn` that may wait for other ranks
    (`blocking`) runs off the inter-op pool (`_off_pool`). In a graph a unison error does not
    escape the Python kernel: it is filed, and the outputs are read after a status op that fails
    with the error's `tf.errors` code (see `_status_op`), as eager mode raises it.
    """
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    if executing_eagerly():
        route = route_for(inputs, device_path=device_path, op_name=op_name.split("_", 1)[0])
        try:
            if route.device == "cuda":
                return run_on_device(fn, inputs, output_dtypes)
            outputs = fn(*_numpy_args(inputs))
        except UnisonError as error:
            raise to_tf_error(error) from error
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, output_dtypes)]

    with_status = _status_op.available()
    dtypes = [*output_dtypes, tf.int64] if with_status else list(output_dtypes)

    def graph_fn(*arrays: np.ndarray) -> list[np.ndarray]:
        try:
            with for_a_graph():  # its wait is the main thread's, which runs the graph (deadlock check)
                outputs = fn(*arrays)
        except UnisonError as error:
            if not with_status:
                raise
            error_id = _status_op.file_error(_error_code(error), str(error))
            # Never read: the status op fails first and the outputs wait for it.
            return [np.zeros(0, d.as_numpy_dtype) for d in output_dtypes] + [np.int64(error_id)]
        arrays_out = [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outputs, output_dtypes)]
        return arrays_out + [np.int64(0)] if with_status else arrays_out

    name = _UNSAFE.sub("_", op_name)[:200] or "UnisonCollective"
    if blocking and not tf.inside_function():
        results = _off_pool(graph_fn, inputs, dtypes, name)
    else:
        ran = tf.numpy_function(graph_fn, inputs, dtypes, stateful=True, name=name)
        results = list(ran) if isinstance(ran, (list, tuple)) else [ran]
    if not with_status:
        return results
    status = _status_op.check(results[-1], name=f"{name}_status")
    with tf.control_dependencies([status]):
        return [tf.identity(r) for r in results[:-1]]
