"""A TensorFlow 2 GradientTape loop on scikit-learn's bundled 8x8 digits, data-parallel with unison.

Run: ``mpiexec -n 2 python examples/tensorflow2_mnist.py``
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/tensorflow2_mnist.py``)
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import unison.tensorflow as hvd  # noqa: E402


def main() -> None:
    hvd.init()
    digits = load_digits()
    x = tf.constant(digits.data / 16.0, tf.float32)
    y = tf.constant(digits.target, tf.int64)
    data = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
            .shuffle(512, seed=0).repeat().batch(32))
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9)

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor, first: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            # Start every rank from rank 0's weights and optimizer state (after the first step
            # has created the optimizer's variables).
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    for step, (images, labels) in enumerate(data.take(300)):
        loss = train_step(images, labels, step == 0)
        if step % 50 == 0 and hvd.rank() == 0:
            print(f"step {step}: loss {float(loss):.4f}")
    accuracy = tf.reduce_mean(tf.cast(tf.argmax(model(x), 1) == y, tf.float32))
    if hvd.rank() == 0:
        print(f"accuracy on all {len(digits.data)} digits: {float(accuracy):.3f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
