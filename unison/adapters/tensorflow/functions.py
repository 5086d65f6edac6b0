"""Helpers on top of the TensorFlow collectives: variable and object broadcast, and rank/size as graph ops."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import tensorflow as tf

from ..._job import objects as _objects
from ..._job.runtime import job
from ...process_sets import ProcessSet, global_process_set
from ._bridge import executing_eagerly, run
from ._bridge import no_autograph as _no_autograph
from .collectives import broadcast_

__all__ = [
    "allgather_object", "broadcast_object", "broadcast_object_fn", "broadcast_variables", "local_rank_op", "local_size_op",
    "process_set_included_op", "rank_op", "size_op",
]

# A Python object, the same kind on every rank.
_T = TypeVar("_T")


def _variables_key(variables: Sequence[tf.Variable]) -> str:
    names = "|".join(f"{getattr(v, 'name', '')}{tuple(v.shape)}" for v in variables)
    return f"{len(variables)}.{zlib.crc32(names.encode()):08x}"


@_no_autograph
def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int,
                        process_set: ProcessSet = global_process_set, inplace: bool = False) -> tf.Operation | None:
    """Assign every variable `root_rank`'s value, all in one batch of broadcasts.

    Eagerly this runs at once; inside a graph it returns the grouped assign op. `inplace` is
    accepted for Horovod compatibility (assignment is always in place here).

    Example:
        >>> hvd.broadcast_variables(model.variables, root_rank=0)   # doctest: +SKIP
    """
    variables = list(variables)
    if not variables:
        return None if executing_eagerly() else tf.no_op()
    # A name derived from the variables (not a call counter) is the same on every rank and lets the
    # engine cache the negotiation when the same variables are broadcast again.
    assigned = broadcast_(variables, root_rank, name=f"broadcast_variables.{_variables_key(variables)}",
                          process_set=process_set)
    return None if executing_eagerly() else tf.group(*assigned)


@_no_autograph
def broadcast_object(obj: _T, root_rank: int = 0, session: tf.compat.v1.Session | None = None,
                     name: str | None = None, process_set: ProcessSet = global_process_set) -> _T:
    """Return `root_rank`'s Python object on every rank (pickled; trusted peers only). Eager only."""
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: tf.compat.v1.Session | None = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[_T], _T]:
    """Return a function of one object that `broadcast_object`s it with these arguments.

    Example:
        >>> share = hvd.broadcast_object_fn(root_rank=0)   # doctest: +SKIP
        >>> config = share(config)                         # doctest: +SKIP
    """

    def broadcast(obj: _T) -> _T:
        return broadcast_object(obj, root_rank, session, name, process_set)

    return broadcast


@_no_autograph
def allgather_object(obj: _T, session: tf.compat.v1.Session | None = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[_T]:
    """Return every set member's Python object, in set-rank order (pickled). Eager only."""
    return _objects.allgather_object(obj, name=name, process_set=process_set)


def _int_op(value: Callable[[], int], name: str | None) -> tf.Tensor:
    """An int32 scalar read when the op runs (so a graph sees the job as it is at run time)."""
    if executing_eagerly():
        return tf.constant(int(value()), dtype=tf.int32)
    # It never waits for another rank, so a Session graph runs it on the inter-op pool (no slow path).
    return tf.reshape(run(lambda: [np.int32(value())], [], [tf.int32], name or "HorovodIntOp", blocking=False)[0], [])


@_no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The size of a process set (default: the whole job) as an int32 tensor."""
    return _int_op(lambda: len(job().registered_sets()[process_set_id]), name)


@_no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this node as an int32 tensor."""
    return _int_op(lambda: job().local_size, name)


@_no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's global rank as an int32 tensor."""
    return _int_op(lambda: job().rank, name)


@_no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its node as an int32 tensor."""
    return _int_op(lambda: job().local_rank, name)


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this process belongs to the process set, else 0, as an int32 tensor."""
    return _int_op(lambda: int(job().rank in (job().set_members(process_set_id) or ())), name)
