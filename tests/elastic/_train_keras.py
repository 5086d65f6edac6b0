"""An elastic Keras job for the tests: KerasState, the three elastic callbacks, and an optional SIGKILL.

Environment: ``ELASTIC_OUT`` (results), ``ELASTIC_KILL=COMMIT:RANK`` (that rank SIGKILLs itself at
the end of the batch after that many commits, once per job).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import keras
import numpy as np

import unison.keras as hvd

EPOCHS = 3


class Kill(keras.callbacks.Callback):
    def __init__(self, state: Any, out: Path) -> None:
        super().__init__()
        self.state, self.out = state, out

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        spec = os.environ.get("ELASTIC_KILL", "")
        done = self.out / "elastic_kill-done"
        if spec and not done.exists():
            at_commit, at_rank = (int(x) for x in spec.split(":"))
            if self.state.commits >= at_commit and hvd.rank() == at_rank:
                done.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    hvd.init()
    out = Path(os.environ["ELASTIC_OUT"])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.5)), loss="mse")
    rng = np.random.default_rng(hvd.rank())
    x = rng.integers(0, 4, size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2), Kill(state, out)]

    @hvd.elastic.run
    def train(state: Any) -> None:
        model.fit(x, y, batch_size=4, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    result = {"rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch, "commits": state.commits,
              "weights": [w.tobytes().hex() for w in model.get_weights()],
              "optimizer": [np.asarray(v).tobytes().hex() for v in model.optimizer.variables]}
    (out / f"result-{hvd.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
