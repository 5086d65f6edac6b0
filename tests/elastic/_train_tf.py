"""An elastic TensorFlow custom training loop for the tests: exact arithmetic, checked bit for bit.

Each sample i has an integer feature vector x_i. A step's loss is the sum of ``x_i . w`` over the
rank's part of the global batch, so the gradient a ``DistributedGradientTape`` sums over the ranks
is the sum of the batch's feature vectors: integers held in float64, exact in any order. A Keras
SGD with momentum (learning rate 0.5) applies it; the step records its global batch in
``state.history`` and commits. Replaying ``history`` from zeros in one process must give the
committed weights and optimizer variables bit for bit, and the history must hold every sample index
exactly once per epoch.

The data position is part of the state: epoch ``e`` visits a fixed permutation of the samples, and
``state.position`` says how many of them the committed steps consumed. Each step takes the next
``BATCH * size`` of them; rank r takes every size-th one from the r-th.

Environment: ``ELASTIC_OUT`` (directory for results and progress), ``ELASTIC_SAMPLES``,
``ELASTIC_EPOCHS``, ``ELASTIC_STEP_SECONDS``, ``ELASTIC_KILL=COMMIT:RANK`` (that rank SIGKILLs itself
before the allreduce of the step after that commit, once per job), ``ELASTIC_TF_STATE`` (``tensorflow``:
a ``TensorFlowState`` of a ``tf.Variable`` and the optimizer's variables; ``keras``: a
``TensorFlowKerasState`` of a Keras model and its optimizer, built lazily at the first step).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import unison.tensorflow as hvd

BATCH = 2
FEATURES = 4
SEED = 7


def features(index: int) -> list[float]:
    return [float(index % 7), float(index % 5), 1.0, float(index % 3)]


def order(samples: int, epoch: int) -> list[int]:
    """The order in which epoch `epoch` visits the samples."""
    return [int(i) for i in np.random.default_rng([SEED, epoch]).permutation(samples)]


class Model:
    """The weights and the optimizer of one mode, with the step both the job and the replay take."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.optimizer = keras.optimizers.SGD(learning_rate=0.5, momentum=0.5)
        if mode == "tensorflow":
            self.weight = tf.Variable(np.zeros((FEATURES, 1)), dtype=tf.float64, name="weight")
            self.optimizer.build([self.weight])  # its slots join the TensorFlowState's variables
            self.keras = None
        elif mode == "keras":
            self.keras = keras.Sequential([keras.Input((FEATURES,), dtype="float64"),
                                           keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                                                              dtype="float64")])
            self.weight = self.keras.trainable_variables[0]
        else:
            raise ValueError(f"ELASTIC_TF_STATE must be 'tensorflow' or 'keras'. Got {mode!r}.")

    def state(self, **values: Any) -> Any:
        if self.keras is None:
            return hvd.elastic.TensorFlowState([self.weight, *self.optimizer.variables], **values)
        return hvd.elastic.TensorFlowKerasState(self.keras, self.optimizer, **values)

    def loss(self, x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.matmul(x, self.weight) if self.keras is None else self.keras(x))

    def apply(self, gradient: tf.Tensor) -> None:
        self.optimizer.apply_gradients([(gradient, self.weight)])

    def digest(self) -> dict[str, object]:
        """The weight and every optimizer variable, as hex of their bytes."""
        return {"weight": self.weight.numpy().tobytes().hex(),
                "optimizer": [np.asarray(v.numpy()).tobytes().hex() for v in self.optimizer.variables]}


def inputs(indices: list[int]) -> tf.Tensor:
    return tf.constant(np.array([features(i) for i in indices], dtype=np.float64).reshape(-1, FEATURES))


def replay(history: list[tuple[int, list[int]]], mode: str) -> dict[str, object]:
    """The digest after replaying `history` (epoch, global batch) in one process."""
    model = Model(mode)
    for _, indices in history:
        with tf.GradientTape() as tape:
            loss = model.loss(inputs(indices))
        model.apply(tape.gradient(loss, model.weight))
    return model.digest()


def _kill_now(commits: int, out: Path) -> bool:
    spec = os.environ.get("ELASTIC_KILL", "")
    if not spec:
        return False
    at_commit, at_rank = (int(x) for x in spec.split(":"))
    done = out / "elastic_kill-done"
    if commits == at_commit and hvd.rank() == at_rank and not done.exists():
        done.write_text(str(os.getpid()))
        return True
    return False


def main() -> None:
    hvd.init()
    out = Path(os.environ["ELASTIC_OUT"])
    samples = int(os.environ.get("ELASTIC_SAMPLES", "24"))
    epochs = int(os.environ.get("ELASTIC_EPOCHS", "2"))
    pause = float(os.environ.get("ELASTIC_STEP_SECONDS", "0.05"))
    model = Model(os.environ.get("ELASTIC_TF_STATE", "tensorflow"))
    state = model.state(epoch=0, position=0, history=[])
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.epoch < epochs:
            visit = order(samples, state.epoch)
            while state.position < samples:
                size, rank = hvd.size(), hvd.rank()
                batch = visit[state.position:state.position + BATCH * size]
                local = batch[rank::size]
                if _kill_now(state.statistics()["commits"], out):
                    os.kill(os.getpid(), signal.SIGKILL)
                with tf.GradientTape() as tape:
                    loss = model.loss(inputs(local))
                tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
                model.apply(tape.gradient(loss, model.weight))
                seen = sorted(i for part in hvd.allgather_object(local, name="seen") for i in part)
                state.history.append((state.epoch, seen))
                state.position += len(batch)
                state.commit()
                if rank == 0:
                    (out / "progress").write_text(f"{state.statistics()['commits']} {size}")
                time.sleep(pause)
            state.epoch += 1
            state.position = 0
            state.commit()

    train(state)
    result = {"rank": hvd.rank(), "size": hvd.size(), "launch": int(os.environ.get("UNISON_ELASTIC_EPOCH", "0")),
              "mode": model.mode, "commits": state.statistics()["commits"], "history": state.history, **model.digest(),
              "resets": resets}
    (out / f"result-{hvd.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
