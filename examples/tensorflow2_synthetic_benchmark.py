"""Synthetic TensorFlow 2 training throughput with unison (Horovod's tensorflow2_synthetic_benchmark).

Run: ``mpiexec -n 2 python examples/tensorflow2_synthetic_benchmark.py --batch-size 32``
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/tensorflow2_synthetic_benchmark.py``)
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import unison.tensorflow as hvd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()
    hvd.init()
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                              keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    data = tf.random.uniform([args.batch_size, 32, 32, 3])
    target = tf.random.uniform([args.batch_size], maxval=10, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(first: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    step(True)
    for _ in range(args.num_warmup_batches):
        step(False)
    rates = []
    for i in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step(False)
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        rates.append(rate)
        if hvd.rank() == 0:
            print(f"Iter #{i}: {rate:.1f} img/sec per rank")
    if hvd.rank() == 0:
        mean = float(np.mean(rates))
        print(f"Img/sec per rank: {mean:.1f}; total on {hvd.size()} ranks: {hvd.size() * mean:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
