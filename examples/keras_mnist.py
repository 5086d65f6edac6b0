"""Keras 3 model.fit on scikit-learn's bundled 8x8 digits, data-parallel with unison.

Run: ``mpiexec -n 2 python examples/keras_mnist.py`` (any backend: KERAS_BACKEND=tensorflow or torch).
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/keras_mnist.py``)
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import unison.keras as hvd  # noqa: E402


def main() -> None:
    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    # Each rank trains on its own shard; evaluation uses the whole set.
    x_shard, y_shard = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    base_lr = 0.05
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(base_lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=base_lr * hvd.size(), warmup_epochs=2),
    ]
    model.fit(x_shard, y_shard, batch_size=32, epochs=6, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    loss, accuracy = model.evaluate(x, y, verbose=0)
    if hvd.rank() == 0:
        print(f"accuracy on all {len(x)} digits: {accuracy:.3f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
