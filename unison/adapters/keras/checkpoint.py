"""BestModelCheckpoint: a Keras 3 ModelCheckpoint that keeps the best model so far, written by rank 0 only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras

from ..._job.runtime import job
from ...errors import InvalidArgumentError

if TYPE_CHECKING:
    from .callback_logic import Logs

__all__ = ["BestModelCheckpoint", "KerasBestModelCheckpoint"]


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Save the model whenever `monitor` improves (``save_best_only=True``), on rank 0 only.

    Horovod's signature has no file path (its Spark estimator sets ``filepath`` after construction);
    pass ``filepath=`` here or set the attribute before training. Keras 3 wants it to end in
    ``.keras`` (``.weights.h5`` with ``save_weights_only=True``). The other ranks skip saving, so
    only one process writes the file.

    Example:
        >>> checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath="best.keras")  # doctest: +SKIP
        >>> model.fit(x, y, validation_split=0.1, callbacks=[checkpoint])                            # doctest: +SKIP
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: str | int = "epoch", *, filepath: str | None = None) -> None:
        # Keras checks the path's extension when constructed; without a path yet, it checks a stand-in.
        stand_in = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath or stand_in, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        self.filepath: str | None = None if filepath is None else self.filepath

    def on_train_begin(self, logs: Logs | None = None) -> None:
        if not self.filepath:
            raise InvalidArgumentError(
                "BestModelCheckpoint needs a file path to save to: pass filepath='best.keras' (or "
                "'best.weights.h5' with save_weights_only=True), or set checkpoint.filepath before "
                "model.fit. Got filepath=None."
            )
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch: int, logs: Logs | None = None) -> None:
        if job().rank == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if job().rank == 0:
            super().on_epoch_end(epoch, logs)


class KerasBestModelCheckpoint(BestModelCheckpoint):
    """`BestModelCheckpoint` with horovod.keras's positional order, which has no `save_weights_only`
    (given here by keyword only). ``unison.keras.callbacks.BestModelCheckpoint`` is this class.

    Example:
        >>> hvd.callbacks.BestModelCheckpoint("val_loss", 1, "min", filepath="best.keras")   # doctest: +SKIP
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: str | int = "epoch", *, save_weights_only: bool = False,
                 filepath: str | None = None) -> None:
        super().__init__(monitor, verbose, save_weights_only, mode, save_freq, filepath=filepath)
