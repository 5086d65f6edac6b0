"""load_model for Keras 2 (tf_keras): load a model saved with a wrapped optimizer and wrap its optimizer again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import tf_keras

from ..array_compression import Compression
from .optimizer import DistributedOptimizer, is_distributed

if TYPE_CHECKING:
    import os

    import h5py

    from ...compression import Compressor
    from .optimizer import Keras2Optimizer

__all__ = ["load_model"]


def load_model(filepath: str | os.PathLike[str] | h5py.File,
               custom_optimizers: Iterable[type[Keras2Optimizer]] | None = None,
               custom_objects: Mapping[str, object] | None = None,
               compression: type[Compressor] | Compressor = Compression.none,
               legacy_opts: bool = False) -> tf_keras.Model:
    """Load a model with ``tf.keras.models.load_model`` (Keras 2) and make its optimizer distributed.

    A wrapped optimizer is saved under its own class name, so plain tf_keras loads the file too
    (``.h5``, ``.keras`` or a SavedModel directory); this function then wraps the restored
    optimizer (`custom_optimizers` are made known to tf_keras). tf_keras restores a legacy
    optimizer as a legacy one by itself, so `legacy_opts` changes nothing.

    Example:
        >>> model = hvd.load_model("checkpoint.h5")   # doctest: +SKIP
    """
    objects = dict(custom_objects or {})
    for optimizer_class in custom_optimizers or []:
        objects.setdefault(optimizer_class.__name__, optimizer_class)
    model = tf_keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        DistributedOptimizer(optimizer, compression=compression)
    return model
