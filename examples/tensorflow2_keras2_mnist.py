"""Keras 2 code (``tf.keras`` as tf_keras) on current TensorFlow: Horovod's tensorflow2_keras_mnist.py with checkpoints and resume.

TensorFlow 2.16 and later bring Keras 3; Keras 2 code keeps running unchanged with the ``tf-keras``
package and ``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported (this script sets it when
unset). ``unison.tensorflow.keras`` then serves Keras 2: the optimizer, callbacks and ``load_model``
are tf_keras's. The model trains on scikit-learn's bundled 8x8 digits; rank 0 writes a checkpoint
per epoch, and a second run resumes from the last one as Horovod's ``keras_imagenet_resnet50.py``
does (rank 0 loads it, the others build the model afresh, the broadcast callback syncs them).

Run: ``mpiexec -n 2 python examples/tensorflow2_keras2_mnist.py --epochs 4 --checkpoint-dir ckpt``,
then again with ``--epochs 6`` to go on from epoch 4 (first ``pip install "tf-keras==2.21.*"
--no-deps``: the tf-keras release of your TensorFlow's minor version; with the virtual environment
active, or by path: ``.venv/bin/mpiexec -n 2 .venv/bin/python examples/tensorflow2_keras2_mnist.py``).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow is imported: tf.keras is Keras 2
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import unison.tensorflow.keras as hvd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--checkpoint-dir", default=None, help="write checkpoint-{epoch}.h5 here; resume from it")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
               .shuffle(512, seed=hvd.rank()).repeat().batch(32))

    # Horovod's resume recipe: find the last checkpoint on rank 0 and tell the others.
    resume_from_epoch = 0
    if args.checkpoint_dir:
        for epoch in range(args.epochs, 0, -1):
            if os.path.exists(os.path.join(args.checkpoint_dir, f"checkpoint-{epoch}.h5")):
                resume_from_epoch = epoch
                break
    resume_from_epoch = hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch")

    scaled_lr = 0.01 * hvd.size()
    if int(resume_from_epoch) > 0 and hvd.rank() == 0:
        model = hvd.load_model(os.path.join(args.checkpoint_dir, f"checkpoint-{int(resume_from_epoch)}.h5"))
    else:
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        # Keras 2 spellings: the legacy optimizer takes lr=; compile takes experimental_run_tf_function.
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(lr=scaled_lr),
                                       backward_passes_per_step=1, average_aggregated_gradients=True)
        model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                      experimental_run_tf_function=False)

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
    ]
    if hvd.rank() == 0 and args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.h5")))
    model.fit(dataset, steps_per_epoch=896 // 32 // hvd.size(), callbacks=callbacks, epochs=args.epochs,
              initial_epoch=resume_from_epoch, verbose=2 if hvd.rank() == 0 else 0)
    loss, accuracy = model.evaluate(x, y, verbose=0)
    if hvd.rank() == 0:
        print(f"tf.keras is {tf.keras.Model.__module__.split('.')[0]}; the optimizer is "
              f"{type(model.optimizer).__module__}.{type(model.optimizer).__name__}; "
              f"resumed from epoch {int(resume_from_epoch)}")
        print(f"accuracy on all {len(x)} digits: {accuracy:.3f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
