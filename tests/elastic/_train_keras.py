"""An elastic Keras ``model.fit`` job for the tests: KerasState, the three elastic callbacks, exact arithmetic.

Rank r's data is a repeated stream of ``STEPS`` batches of ``BATCH`` samples (sample ids
``r * STEPS * BATCH + ...``, integer features), fed with ``steps_per_epoch=STEPS``. After a reset the
stream starts at the batch after the committed ``state.batch``, where ``UpdateBatchStateCallback``
resumes the epoch. The loss is the sum of the model's outputs, so a step's gradient, summed over the
ranks by ``DistributedOptimizer(op=Sum)``, is the sum of the global batch's feature vectors: integers,
exact in any order, applied by SGD with momentum and a learning rate of 0.5. ``Record`` appends each
step's (epoch, stream batch, global batch's sample ids) to ``state.history`` before the commit, so the
state carries the committed steps and ``replay`` recomputes the model and optimizer in one process.

Environment: ``ELASTIC_OUT`` (results), ``ELASTIC_KILL=COMMIT:RANK`` (that rank SIGKILLs itself at the
end of the first batch that finds that many commits made, before that batch's commit; once per job).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import unison.keras as hvd

EPOCHS = 3
STEPS = 8  # batches per epoch
BATCH = 4  # samples per rank and batch
FEATURES = 4


def features(sample: int) -> list[float]:
    return [float(sample % 7), float(sample % 5), 1.0, float(sample % 3)]


def samples(rank: int, batch: int) -> list[int]:
    """The ids of rank `rank`'s samples in batch `batch` of an epoch."""
    return [(rank * STEPS + batch) * BATCH + k for k in range(BATCH)]


def global_batch(batch: int, size: int) -> list[int]:
    return [i for rank in range(size) for i in samples(rank, batch)]


def inputs(ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([features(i) for i in ids], dtype=np.float64).reshape(-1, FEATURES)
    return x, np.zeros((len(ids), 1))


class SumOfOutputs(keras.losses.Loss):
    """The sum of the outputs: its gradient is the sum of the inputs, whatever the weights."""

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return keras.ops.sum(y_pred, axis=-1)


def model_and_optimizer() -> tuple[keras.Model, keras.optimizers.Optimizer]:
    model = keras.Sequential([keras.Input((FEATURES,), dtype="float64"),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", dtype="float64")])
    return model, keras.optimizers.SGD(0.5, momentum=0.5)


def digest(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> dict[str, list[str]]:
    return {"weights": [w.tobytes().hex() for w in model.get_weights()],
            "optimizer": [np.asarray(v).tobytes().hex() for v in optimizer.variables]}


def replay(history: list[tuple[int, int, list[int]]]) -> dict[str, list[str]]:
    """The weights and optimizer variables after training on `history`'s global batches in one process."""
    model, optimizer = model_and_optimizer()
    model.compile(optimizer, loss=SumOfOutputs(reduction="sum"))
    for _, _, ids in history:
        model.train_on_batch(*inputs(ids))
    return digest(model, optimizer)


def resumed_batch(state: Any) -> int:
    """The epoch's batch a launch starts at: the one after the committed `state.batch` (0 at an epoch's end)."""
    return state.batch + 1 if state.batch > 0 else 0


def stream(rank: int, start: int) -> tf.data.Dataset:
    """Rank `rank`'s batches, repeated, from batch `start` of an epoch."""
    x, y = zip(*(inputs(samples(rank, batch)) for batch in range(STEPS)))
    return tf.data.Dataset.from_tensor_slices((np.stack(x), np.stack(y))).repeat().skip(start)


class Record(keras.callbacks.Callback):
    """Append each step's (epoch, batch, global batch) to ``state.history``: before the commit, so it is committed."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.position = 0

    def on_train_begin(self, logs: Any = None) -> None:
        self.position = resumed_batch(self.state)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        at = self.position % STEPS
        self.state.history.append((self.state.epoch, at, global_batch(at, hvd.size())))
        self.position += 1


class Kill(keras.callbacks.Callback):
    def __init__(self, state: Any, out: Path) -> None:
        super().__init__()
        self.state, self.out = state, out

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        spec = os.environ.get("ELASTIC_KILL", "")
        done = self.out / "elastic_kill-done"
        if spec and not done.exists():
            at_commit, at_rank = (int(x) for x in spec.split(":"))
            if self.state.statistics()["commits"] >= at_commit and hvd.rank() == at_rank:
                done.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test's ranks can be asked where they are
    hvd.init()
    out = Path(os.environ["ELASTIC_OUT"])
    model, optimizer = model_and_optimizer()
    model.compile(hvd.DistributedOptimizer(optimizer, op=hvd.Sum), loss=SumOfOutputs(reduction="sum"))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, history=[])
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 Record(state), Kill(state, out), hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]

    @hvd.elastic.run
    def train(state: Any) -> None:
        model.fit(stream(hvd.rank(), resumed_batch(state)), steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch,
                  callbacks=callbacks, verbose=0, shuffle=False)

    train(state)
    result = {"rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch, "batch": state.batch,
              "commits": state.statistics()["commits"], "history": state.history, **digest(model, model.optimizer),
              "inner": digest(model, optimizer)["optimizer"]}
    (out / f"result-{hvd.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
