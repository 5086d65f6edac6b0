"""load_model: load a Keras model saved with a wrapped optimizer and wrap its optimizer again."""

from __future__ import annotations

from typing import Any

import keras

from ..array_compression import Compression
from .optimizer import DistributedOptimizer, is_distributed

__all__ = ["load_model"]


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> keras.Model:
    """Load a model with `keras.models.load_model` and make its optimizer distributed.

    A wrapped optimizer is saved under its own class name, so plain Keras loads the file too;
    this function then wraps the restored optimizer (`custom_optimizers` are made known to Keras).

    Example:
        >>> model = hvd.load_model("model.keras")   # doctest: +SKIP
    """
    objects = dict(custom_objects or {})
    for optimizer_class in custom_optimizers or []:
        objects.setdefault(optimizer_class.__name__, optimizer_class)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        DistributedOptimizer(optimizer, compression=compression)
    return model
