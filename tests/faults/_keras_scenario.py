"""A Keras job whose callback calls a collective on rank 0 only: `python _keras_scenario.py PIDDIR`.

Rank 0 averages a metric with `allreduce` at the end of the first epoch, in the main thread; rank 1
goes on into the second epoch, whose train step (a tf.function) waits for the gradients' allreduce
in one of TensorFlow's threads while the main thread waits in C for the step to end. Neither rank can
ever submit what the other waits for. Every rank writes PIDDIR/pid-R, and PIDDIR/finally-R from its
`finally:` block.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import unison.keras as hvd  # noqa: E402

pid_dir = Path(sys.argv[1])
hvd.init()
(pid_dir / f"pid-{hvd.rank()}").write_text(str(os.getpid()))


class RankZeroMetric(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:  # the bug: every rank must call it
            hvd.allreduce(np.array([logs["loss"]]), name="epoch_loss")


try:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=4, epochs=3, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), RankZeroMetric()])
finally:
    (pid_dir / f"finally-{hvd.rank()}").write_text("")
