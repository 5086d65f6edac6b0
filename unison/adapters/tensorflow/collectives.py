"""The collectives on TensorFlow tensors, eager and in tf.function, with Horovod's gradients.

Each public function resolves its arguments, fixes the collective's name (see `_bridge.graph_name`),
and runs the NumPy-level collective through one bridge op; grouped forms put the whole group in one
op, so a step's tensors are negotiated and reduced together instead of one blocking op at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from ..._job import collectives as C
from ..._job import submit as S
from ..._job.runtime import is_initialized, job
from ..._job.submit import set_rank, set_size
from ...errors import InvalidArgumentError, UnisonNotImplementedError
from ...ops import CollectiveKind, ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..array_compression import Compression
from ._bridge import graph_name, run
from ._bridge import no_autograph as _no_autograph

if TYPE_CHECKING:
    from typing import TypeAlias

    from tensorflow.types.experimental import TensorLike

    from ...compression import Compressor

    # What the tf.custom_gradient functions of one tensor or a group return: the output(s) and their gradient.
    _WithGradient: TypeAlias = tuple[tf.Tensor | list[tf.Tensor], Callable[..., list[tf.Tensor]]]

__all__ = [
    "allgather", "allreduce", "alltoall", "broadcast", "broadcast_", "grouped_allgather",
    "grouped_allreduce", "grouped_reducescatter", "join", "reducescatter", "set_rank", "set_size",
]


def _zeros_for(dys: Sequence[tf.Tensor | None], xs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    return [tf.zeros_like(x) if dy is None else dy for dy, x in zip(dys, xs)]


def _gradient_name(name: str | None, suffix: str = "grad") -> str | None:
    """The name of a collective in a gradient: None eagerly (or for an unnamed forward op), else
    ``<forward name>_<suffix>`` made unique in the graph like any graph name.

    Each gradient computation builds its own ops (``tf.gradients`` twice on one output, or once per
    loss), and one Session.run may run them together: a name fixed per forward op would put two
    collectives in flight under one name.
    """
    if name is None or tf.executing_eagerly():
        return None
    return graph_name("HorovodGradient", f"{name}_{suffix}")


def _check_registered(process_set: ProcessSet) -> None:
    """Refuse, when the op is made, a set the job has not registered, as Horovod's ops do.

    Horovod's Python layer reads the set's size from its table while it builds the op, so an unknown
    set raises `ValueError` there, eagerly and in a graph alike; without this check a graph would
    only fail when run. Before `init()` the collective itself reports that.
    """
    set_id = process_set.process_set_id
    if is_initialized() and (set_id is None or job().set_members(set_id) is None):
        registered = sorted(job().registered_sets())
        raise InvalidArgumentError(
            f"Process set does not exist or has not been registered: {process_set} (registered ids: "
            f"{registered}). Register it with init(process_sets=[...]) or add_process_set()."
        )


def _with_shape(outputs: list[tf.Tensor], shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return outputs


# -- allreduce -------------------------------------------------------------------------------------


_OUTPUT_POOL: dict[tuple[object, ...], list[np.ndarray]] = {}


def _pooled_outputs(name: str, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Output buffers for the graph op `name`, allocated once and reused while shapes stay the same."""
    key = (name, tuple((a.shape, a.dtype.str) for a in arrays))
    pool = _OUTPUT_POOL.get(key)
    if pool is None:
        pool = _OUTPUT_POOL[key] = [np.empty(a.shape, a.dtype) for a in arrays]
    return pool


def _allreduce_group(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float, postscale: float,
                     name: str | None, process_set: ProcessSet, grouped: bool) -> list[tf.Tensor]:
    """Dense allreduce of one tensor or one group, with the allreduce-of-gradient gradient."""
    xs = [tf.convert_to_tensor(t) for t in tensors]
    # Inside a graph, numpy_function copies what it returns into TensorFlow's own tensors, so the
    # results can land in buffers kept from one step to the next: allocating (and page-faulting) tens
    # of megabytes of fresh output memory every step cost about as much as the reduction itself.
    # Eagerly the returned arrays may be shared with the tensors, so fresh ones are used there.
    reuse_outputs = name is not None and not tf.executing_eagerly()

    @tf.custom_gradient
    def reduce(*inputs: tf.Tensor) -> _WithGradient:
        def fn(*arrays: np.ndarray) -> list[np.ndarray]:
            if reuse_outputs and name is not None:
                outs = _pooled_outputs(name, arrays)
                handle, _, _ = S.submit(
                    CollectiveKind.ALLREDUCE, list(arrays), name, process_set, op=op, prescale=prescale,
                    postscale=postscale, grouped=grouped,
                    outputs=[o.view(np.uint16) if o.dtype.name == "bfloat16" else o for o in outs],
                )
                S.synchronize(handle)
            elif grouped:
                outs = C.grouped_allreduce(list(arrays), name=name, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale, process_set=process_set)
            else:
                outs = [C.allreduce(arrays[0], name=name, op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set)]
            return [np.reshape(o, a.shape) for o, a in zip(outs, arrays)]

        outputs = _with_shape(run(fn, inputs, [x.dtype for x in inputs], f"HorovodAllreduce_{name}",
                                  device_path=True),
                              [x.shape for x in inputs])

        def grad(*dys: tf.Tensor | None) -> list[tf.Tensor]:
            grad_name = _gradient_name(name)
            return _allreduce_group(_zeros_for(dys, inputs), op, prescale, postscale, grad_name,
                                    process_set, grouped)

        return (outputs if grouped else outputs[0]), grad

    result = reduce(*xs)
    return list(result) if grouped else [result]


def _check_sparse(op: ReduceOp, prescale: float, postscale: float) -> None:
    """Refuse, with Horovod's errors, what the gather of `tf.IndexedSlices` cannot do.

    Called before anything of the call is submitted, so a refused call leaves nothing in flight.
    """
    if op is ReduceOp.ADASUM:
        raise UnisonNotImplementedError(
            "The Adasum reduction does not currently support sparse tensors. As a workaround please pass "
            "sparse_as_dense=True to DistributedOptimizer"
        )
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise UnisonNotImplementedError(
            f"Only Sum and Average ops are supported with tf.IndexedSlices. Got op={op.name}; reduce "
            "tf.convert_to_tensor(slices) instead to use it."
        )
    if prescale != 1.0 or postscale != 1.0:
        raise UnisonNotImplementedError(
            "Pre/postscale_factor are not supported with tf.IndexedSlices. Got "
            f"prescale_factor={prescale}, postscale_factor={postscale}; scale the values yourself."
        )


def _sparse_allreduce(tensor: tf.IndexedSlices, op: ReduceOp, prescale: float, postscale: float,
                      name: str | None, process_set: ProcessSet) -> tf.IndexedSlices:
    _check_sparse(op, prescale, postscale)
    values, indices = grouped_allgather([tensor.values, tensor.indices], name=name,
                                        process_set=process_set)
    if op is ReduceOp.AVERAGE:
        values = values / tf.cast(set_size(process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


@_no_autograph
def allreduce(tensor: TensorLike | tf.IndexedSlices, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Compressor | type[Compressor] = Compression.none,
              op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor | tf.IndexedSlices:
    """Reduce `tensor` across the set's ranks (default op Average); differentiable.

    A `tf.IndexedSlices` is gathered (values and indices) instead, as Horovod does; Average then
    divides the values by the set size.

    Example:
        >>> hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)   # doctest: +SKIP
    """
    _check_registered(process_set)
    resolved = S.resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, resolved, prescale_factor, postscale_factor,
                                 graph_name("HorovodAllgather", name, tensor.values, ignore_name_scope),
                                 process_set)
    tensor = tf.convert_to_tensor(tensor)
    fixed = graph_name("HorovodAllreduce", name, tensor, ignore_name_scope)
    compressed, ctx = compression.compress(tensor)
    (reduced,) = _allreduce_group([compressed], resolved, prescale_factor, postscale_factor, fixed,
                                  process_set, grouped=False)
    return compression.decompress(reduced, ctx)


@_no_autograph
def grouped_allreduce(tensors: Sequence[TensorLike | tf.IndexedSlices], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Compressor | type[Compressor] = Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[tf.Tensor | tf.IndexedSlices]:
    """Reduce a list of tensors as one group in one op; IndexedSlices in it are gathered.

    Dense members may have different dtypes (Horovod requires one dtype).
    """
    if not tensors:
        return list(tensors)
    _check_registered(process_set)
    resolved = S.resolve_op(op, average)
    out: list[tf.Tensor | tf.IndexedSlices | None] = [None] * len(tensors)
    dense_at = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse_at = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse_at:  # before the dense members are submitted: a refusal leaves nothing in flight
        _check_sparse(resolved, prescale_factor, postscale_factor)
    if dense_at:
        dense = [tf.convert_to_tensor(tensors[i]) for i in dense_at]
        fixed = graph_name("HorovodGroupedAllreduce", name, dense[0], ignore_name_scope)
        packed = [compression.compress(t) for t in dense]
        reduced = _allreduce_group([p[0] for p in packed], resolved, prescale_factor,
                                   postscale_factor, fixed, process_set, grouped=True)
        for i, r, (_, ctx) in zip(dense_at, reduced, packed):
            out[i] = compression.decompress(r, ctx)
    for i in sparse_at:
        fixed = graph_name("HorovodAllgather", None if name is None else f"{name}_sparse{i}",
                           tensors[i].values, ignore_name_scope)
        out[i] = _sparse_allreduce(tensors[i], resolved, prescale_factor, postscale_factor, fixed,
                                   process_set)
    return out


# -- allgather -------------------------------------------------------------------------------------


def _allgather_group(tensors: Sequence[tf.Tensor], name: str | None, process_set: ProcessSet,
                     grouped: bool) -> list[tf.Tensor]:
    xs = [tf.convert_to_tensor(t) for t in tensors]

    @tf.custom_gradient
    def gather(*inputs: tf.Tensor) -> _WithGradient:
        def fn(*arrays: np.ndarray) -> list[np.ndarray]:
            if grouped:
                return C.grouped_allgather(list(arrays), name=name, process_set=process_set)
            return [C.allgather(arrays[0], name=name, process_set=process_set)]

        outputs = _with_shape(run(fn, inputs, [x.dtype for x in inputs], f"HorovodAllgather_{name}",
                                  device_path=True),
                              [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in inputs])

        def grad(*dys: tf.Tensor | None) -> list[tf.Tensor]:
            # Horovod: average the gradient over ranks, then keep this rank's rows.
            reduced = _allreduce_group(_zeros_for(dys, outputs), ReduceOp.AVERAGE, 1.0, 1.0,
                                       _gradient_name(name), process_set, grouped=True)
            dims = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in inputs])
            sizes = _allgather_group([dims], _gradient_name(name, "grad_sizes"),
                                     process_set, grouped=False)[0]
            sizes = tf.reshape(sizes, [-1, len(inputs)])
            index = set_rank(process_set)
            grads = []
            for k, r in enumerate(reduced):
                offset = tf.reduce_sum(sizes[:index, k])
                grads.append(r[offset:offset + sizes[index, k]])
            return grads

        return (outputs if grouped else outputs[0]), grad

    result = gather(*xs)
    return list(result) if grouped else [result]


@_no_autograph
def allgather(tensor: TensorLike, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's `tensor` along dimension 0 (first dimensions may differ).

    Example:
        >>> hvd.allgather(tf.fill([hvd.rank() + 1, 2], hvd.rank()))   # doctest: +SKIP
    """
    _check_registered(process_set)
    tensor = tf.convert_to_tensor(tensor)
    fixed = graph_name("HorovodAllgather", name, tensor, ignore_name_scope)
    return _allgather_group([tensor], fixed, process_set, grouped=False)[0]


@_no_autograph
def grouped_allgather(tensors: Sequence[TensorLike], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Gather a list of tensors as one group in one op."""
    if not tensors:
        return []
    _check_registered(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    fixed = graph_name("HorovodGroupedAllgather", name, tensors[0], ignore_name_scope)
    return _allgather_group(tensors, fixed, process_set, grouped=True)


# -- broadcast -------------------------------------------------------------------------------------


def _broadcast_many(tensors: Sequence[tf.Tensor], root_rank: int, names: Sequence[str | None],
                    process_set: ProcessSet) -> list[tf.Tensor]:
    """Broadcast several tensors from one op: all submitted at once, then all awaited."""
    root_rank = int(root_rank)

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        handles = [C.broadcast_async(a, root_rank, name=n, process_set=process_set)
                   for a, n in zip(arrays, names)]
        return [np.reshape(S.synchronize(h), a.shape) for h, a in zip(handles, arrays)]

    xs = [tf.convert_to_tensor(t) for t in tensors]
    return _with_shape(run(fn, xs, [x.dtype for x in xs], f"HorovodBroadcast_{names[0]}", device_path=True),
                       [x.shape for x in xs])


@_no_autograph
def broadcast(tensor: TensorLike, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return `root_rank`'s `tensor` on every rank (a global rank); differentiable.

    The gradient is the Average allreduce of the incoming gradient on the root and zero elsewhere.
    """
    _check_registered(process_set)
    fixed = graph_name("HorovodBroadcast", name, tensor, ignore_name_scope)

    @tf.custom_gradient
    def bcast(x: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
        y = _broadcast_many([x], root_rank, [fixed], process_set)[0]

        def grad(dy: tf.Tensor) -> tf.Tensor:
            grad_name = _gradient_name(fixed)
            reduced = _allreduce_group([dy], ReduceOp.AVERAGE, 1.0, 1.0, grad_name, process_set,
                                       grouped=False)[0]
            return reduced if job().rank == int(root_rank) else reduced * 0

        return y, grad

    return bcast(tf.convert_to_tensor(tensor))


@_no_autograph
def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Overwrite each variable with `root_rank`'s value (one op for all); return the new values."""
    variables = list(variables)
    if not variables:
        return []
    _check_registered(process_set)
    # tf.convert_to_tensor reads tf.Variables and Keras 3 variables alike (Keras's .value is a property).
    current = [tf.convert_to_tensor(v) for v in variables]
    names = [graph_name("HorovodBroadcastInplace", None if name is None else f"{name}_{i}", t)
             for i, (v, t) in enumerate(zip(variables, current))]
    values = _broadcast_many(current, root_rank, names, process_set)
    return [v.assign(value) for v, value in zip(variables, values)]


# -- alltoall --------------------------------------------------------------------------------------


def _alltoall(tensor: tf.Tensor, splits: TensorLike | None, name: str | None,
              process_set: ProcessSet) -> tuple[tf.Tensor, tf.Tensor]:
    has_splits = splits is not None

    @tf.custom_gradient
    def exchange(
        x: tf.Tensor, *split_args: tf.Tensor
    ) -> tuple[tuple[tf.Tensor, tf.Tensor], Callable[..., tuple[tf.Tensor | None, ...]]]:
        def fn(array: np.ndarray, *split_arrays: np.ndarray) -> list[np.ndarray]:
            chosen = split_arrays[0] if split_arrays else None
            output, received = S.synchronize(C.alltoall_async(array, chosen, name, process_set))
            return [output, np.asarray(received, dtype=np.int32)]

        output, received = run(fn, [x, *split_args], [x.dtype, tf.int32], f"HorovodAlltoall_{name}")
        output.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))
        received.set_shape([None])

        def grad(dy: tf.Tensor | None, _dsplits: tf.Tensor | None = None) -> tuple[tf.Tensor | None, ...]:
            dy = tf.zeros_like(output) if dy is None else dy
            back, _ = _alltoall(dy, received, _gradient_name(name), process_set)
            return (back, *([None] * len(split_args)))

        return (output, received), grad

    split_args = [tf.cast(tf.convert_to_tensor(splits), tf.int32)] if has_splits else []
    output, received = exchange(tf.convert_to_tensor(tensor), *split_args)
    return output, received


@_no_autograph
def alltoall(tensor: TensorLike, splits: TensorLike | None = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Send dim-0 slices of `tensor` to each rank and gather theirs; differentiable.

    Returns the output, or ``(output, received_splits)`` when `splits` is given.
    """
    _check_registered(process_set)
    tensor = tf.convert_to_tensor(tensor)
    fixed = graph_name("HorovodAlltoall", name, tensor, ignore_name_scope)
    output, received = _alltoall(tensor, splits, fixed, process_set)
    return output if splits is None else (output, received)


# -- reducescatter ---------------------------------------------------------------------------------


def _reducescatter_group(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float, postscale: float,
                         name: str | None, process_set: ProcessSet, grouped: bool) -> list[tf.Tensor]:
    xs = [tf.convert_to_tensor(t) for t in tensors]

    @tf.custom_gradient
    def scatter(*inputs: tf.Tensor) -> _WithGradient:
        def fn(*arrays: np.ndarray) -> list[np.ndarray]:
            if grouped:
                return C.grouped_reducescatter(list(arrays), name=name, op=op, process_set=process_set,
                                               prescale_factor=prescale, postscale_factor=postscale)
            return [C.reducescatter(arrays[0], name=name, op=op, process_set=process_set,
                                    prescale_factor=prescale, postscale_factor=postscale)]

        outputs = _with_shape(run(fn, inputs, [x.dtype for x in inputs], f"HorovodReducescatter_{name}",
                                  device_path=True),
                              [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in inputs])

        def grad(*dys: tf.Tensor | None) -> list[tf.Tensor]:
            # Horovod's gradient: the allgather of the upstream gradient, times the set's size for
            # Sum (as its torch gradient and unison's torch adapter); times the scale factors here.
            gathered = _allgather_group(_zeros_for(dys, outputs), _gradient_name(name), process_set,
                                        grouped=True)
            factor = prescale * postscale
            if op is ReduceOp.SUM:
                factor *= set_size(process_set)
            return [g * tf.cast(factor, g.dtype) if factor != 1.0 else g for g in gathered]

        return (outputs if grouped else outputs[0]), grad

    result = scatter(*xs)
    return list(result) if grouped else [result]


@_no_autograph
def reducescatter(tensor: TensorLike, device_dense: str = "",
                  compression: Compressor | type[Compressor] = Compression.none,
                  op: ReduceOp | None = ReduceOp.AVERAGE, name: str | None = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce `tensor` across ranks and return this rank's dim-0 slice; differentiable."""
    _check_registered(process_set)
    resolved = S.reducescatter_op(op)
    tensor = tf.convert_to_tensor(tensor)
    fixed = graph_name("HorovodReducescatter", name, tensor, ignore_name_scope)
    compressed, ctx = compression.compress(tensor)
    (out,) = _reducescatter_group([compressed], resolved, prescale_factor, postscale_factor, fixed,
                                  process_set, grouped=False)
    return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors: Sequence[TensorLike], device_dense: str = "",
                          compression: Compressor | type[Compressor] = Compression.none,
                          op: ReduceOp | None = ReduceOp.AVERAGE,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None,
                          ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Reducescatter a list of tensors as one group in one op."""
    if not tensors:
        return []
    _check_registered(process_set)
    resolved = S.reducescatter_op(op)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    fixed = graph_name("HorovodGroupedReducescatter", name, tensors[0], ignore_name_scope)
    packed = [compression.compress(t) for t in tensors]
    outs = _reducescatter_group([p[0] for p in packed], resolved, prescale_factor, postscale_factor,
                                fixed, process_set, grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


# -- join ------------------------------------------------------------------------------------------


@_no_autograph
def join() -> tf.Tensor:
    """Declare this rank out of data and wait for every rank; return the last joined rank (int32)."""
    return run(lambda: [np.int32(C.join())], [], [tf.int32], "HorovodJoin")[0]
