"""Horovod's Keras-level collectives on Python/NumPy values and Keras tensors, for any Keras backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from ..._job import collectives as C
from ...ops import ReduceOp
from ..array_compression import Compression

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ...compression import Compressor

__all__ = ["allgather", "allreduce", "broadcast", "broadcast_global_variables", "reducescatter"]


def _array(value: ArrayLike) -> np.ndarray:
    """`value` as a C-ordered array of its own shape (a scalar stays 0-d, as Horovod's tensors do).

    Python numbers and lists become tensors first, as Horovod's ``tf.constant(value)`` makes them:
    a float is float32 (Keras's floatx), not NumPy's float64.
    """
    if isinstance(value, (bool, int, float, list, tuple)):
        value = keras.ops.convert_to_tensor(value)
    return np.asarray(keras.ops.convert_to_numpy(value), order="C")


# Each returns the backend's own tensor (tf.Tensor, torch.Tensor, jax.Array): Keras names no type for it.
def allreduce(value: ArrayLike, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: ReduceOp | int | None = None,
              compression: type[Compressor] | Compressor = Compression.none) -> Any:
    """Reduce a value across ranks and return a Keras tensor of the value's shape (default op Average).

    Example:
        >>> hvd.allreduce(1.0)   # a 0-d float32 tensor, as Horovod returns   # doctest: +SKIP
    """
    array, ctx = compression.compress(_array(value))
    out = C.allreduce(array, average=average, name=name, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)
    return keras.ops.convert_to_tensor(compression.decompress(np.reshape(out, array.shape), ctx))


def allgather(value: ArrayLike, name: str | None = None) -> Any:
    """Concatenate every rank's value along dimension 0 and return a Keras tensor (a scalar counts as one row)."""
    return keras.ops.convert_to_tensor(C.allgather(np.atleast_1d(_array(value)), name=name))


def broadcast(value: ArrayLike, root_rank: int, name: str | None = None) -> Any:
    """Return `root_rank`'s value on every rank as a Keras tensor of the value's shape.

    Example:
        >>> model.fit(x, y, initial_epoch=hvd.broadcast(resume_from_epoch, 0))   # doctest: +SKIP
    """
    array = _array(value)
    return keras.ops.convert_to_tensor(np.reshape(C.broadcast(array, root_rank, name=name), array.shape))


def reducescatter(value: ArrayLike, name: str | None = None, op: ReduceOp | int = ReduceOp.AVERAGE) -> Any:
    """Reduce a value across ranks and return this rank's dim-0 slice as a Keras tensor."""
    return keras.ops.convert_to_tensor(C.reducescatter(np.atleast_1d(_array(value)), name=name, op=op))


def broadcast_global_variables(root_rank: int) -> None:
    """Keras 3 has no global variable collection; always raises with what to use instead."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() needs TF1 graph mode, which Keras 3 does not have. Use "
        "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) in model.fit, or "
        "hvd.broadcast_variables(model.variables, root_rank) (unison.tensorflow) in custom loops."
    )
