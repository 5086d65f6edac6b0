"""load_model: load a Keras 3 model saved with a wrapped optimizer and wrap its optimizer again."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import keras
import numpy as np

from ..array_compression import Compression
from .optimizer import DistributedOptimizer, is_distributed

if TYPE_CHECKING:
    from ...compression import Compressor

__all__ = ["load_model"]

_H5_SUFFIXES = (".h5", ".hdf5")


def _optimizer_weights_h5(filepath: str | os.PathLike[str]) -> list[np.ndarray] | None:
    """The optimizer values an .h5 file holds, in the order they were saved (None if it has none)."""
    import h5py

    with h5py.File(filepath, "r") as f:
        if "optimizer_weights" not in f:
            return None
        group = f["optimizer_weights"]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in group.attrs["weight_names"]]
        return [np.asarray(group[n]) for n in names]


def _restore_h5_optimizer(model: keras.Model, filepath: str | os.PathLike[str]) -> None:
    """Give a model loaded from .h5 an optimizer built for its variables, with the saved state.

    Keras 3's .h5 loader builds the optimizer for the model's own variable list, which a
    Sequential or functional model leaves empty: the saved slots are dropped and the first
    ``fit`` raises ``Unknown variable``. The optimizer is made again from its config, built for
    ``model.trainable_variables``, and given the values the file holds.
    """
    optimizer = model.optimizer
    if not optimizer.built or len(optimizer._trainable_variables) >= len(model.trainable_variables):
        return
    rebuilt = type(optimizer).from_config(optimizer.get_config())
    rebuilt.build(model.trainable_variables)
    values = _optimizer_weights_h5(filepath)
    if values is not None and len(values) == len(rebuilt.variables):
        rebuilt.set_weights(values)
    model.optimizer = rebuilt


def load_model(filepath: str | os.PathLike[str],
               custom_optimizers: Iterable[type[keras.optimizers.Optimizer]] | None = None,
               custom_objects: Mapping[str, object] | None = None,
               compression: type[Compressor] | Compressor = Compression.none,
               legacy_opts: bool = False) -> keras.Model:
    """Load a model with `keras.models.load_model` and make its optimizer distributed.

    A wrapped optimizer is saved under its own class name, so plain Keras loads the file too;
    this function then wraps the restored optimizer (`custom_optimizers` are made known to Keras).
    From an ``.h5`` file it also restores the optimizer's state, which Keras 3's own loader drops
    (and then cannot train), so Horovod's ``checkpoint-{epoch}.h5`` resume recipe works.

    Example:
        >>> model = hvd.load_model("model.keras")   # doctest: +SKIP
    """
    objects = dict(custom_objects or {})
    for optimizer_class in custom_optimizers or []:
        objects.setdefault(optimizer_class.__name__, optimizer_class)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and str(os.fspath(filepath)).endswith(_H5_SUFFIXES):
        _restore_h5_optimizer(model, filepath)
        optimizer = model.optimizer
    if optimizer is not None and not is_distributed(optimizer):
        DistributedOptimizer(optimizer, compression=compression)
    return model
