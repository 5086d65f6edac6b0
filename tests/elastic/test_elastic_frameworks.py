"""Elastic TensorFlow and Keras jobs on this machine: a rank SIGKILLed in mid-epoch, the survivors going on.

The TensorFlow custom loop (tests/elastic/_train_tf.py, both state classes) and the Keras ``model.fit``
job (tests/elastic/_train_keras.py) compute with exact arithmetic and record the global batches they
commit. After the kill, the ranks of the last launch must hold one state, equal bit for bit to one
process replaying the committed batches, and every sample or batch must have been trained on exactly
once per epoch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import _train_keras, _train_tf
from ._harness import HOSTS, Job, check_each_sample_once, run

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(120)]

HERE = Path(__file__).parent


def _check_survived_a_kill(job: Job, tmp_path: Path) -> None:
    """Rank 1 killed itself in the first launch; the next ran on the two hosts left, and finished."""
    assert job.returncode == 0, job.stderr
    assert (tmp_path / "elastic_kill-done").exists()
    assert "epoch 0 failed (exit status" in job.stderr and f"blacklisting {HOSTS[1]}" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert sorted(r["rank"] for r in job.results) == [0, 1], job.stderr
    assert {r["size"] for r in job.results} == {2}


def _args(max_np: int | None) -> list[str]:
    """2 ranks at least; at most 2 (the third host replaces the killed rank's) or every host (3, then 2)."""
    return ["-np", "2", "--min-np", "2", *(["--max-np", str(max_np)] if max_np else [])]


# 25 samples: 3 ranks take 6 a step, 2 ranks 4, and an epoch's last step leaves a rank or two without
# any. Rank 1 dies before epoch 1's second step (the commit after its first), losing the step's work.
@pytest.mark.parametrize(("mode", "max_np", "kill", "steps"), [
    ("tensorflow", 2, "9:1", [[4, 4, 4, 4, 4, 4, 1], [4, 4, 4, 4, 4, 4, 1]]),
    ("keras", None, "7:1", [[6, 6, 6, 6, 1], [6, 4, 4, 4, 4, 3]]),
])
def test_tensorflow_loop_after_a_kill_equals_its_replay(tmp_path: Path, mode: str, max_np: int | None, kill: str,
                                                        steps: list[list[int]]) -> None:
    samples, epochs = 25, 2
    job = run(tmp_path, HOSTS, _args(max_np), program=str(HERE / "_train_tf.py"),
              env={"ELASTIC_KILL": kill, "ELASTIC_TF_STATE": mode, "ELASTIC_SAMPLES": str(samples),
                   "ELASTIC_EPOCHS": str(epochs)})
    _check_survived_a_kill(job, tmp_path)
    first = job.results[0]
    assert len({json.dumps([r["history"], r["weight"], r["optimizer"], r["commits"]]) for r in job.results}) == 1
    assert first["mode"] == mode and first["launch"] == 1 and first["resets"] == [2]
    history = first["history"]
    assert _train_tf.replay(history, mode) == {"weight": first["weight"], "optimizer": first["optimizer"]}
    assert first["commits"] == len(history) + epochs  # a commit each step and at each epoch's end
    check_each_sample_once(history, samples, epochs)
    assert [[len(b) for e, b in history if e == epoch] for epoch in range(epochs)] == steps


@pytest.mark.parametrize("max_np", [2, None])
def test_keras_fit_after_a_kill_equals_its_replay(tmp_path: Path, max_np: int | None) -> None:
    # Commit 6 follows epoch 1's batch 1; rank 1 dies at the end of batch 2, before any later commit.
    job = run(tmp_path, HOSTS, _args(max_np), program=str(HERE / "_train_keras.py"),
              env={"ELASTIC_KILL": "6:1"})
    _check_survived_a_kill(job, tmp_path)
    first = job.results[0]
    assert len({json.dumps([r["history"], r["weights"], r["optimizer"], r["commits"]]) for r in job.results}) == 1
    history = first["history"]
    assert _train_keras.replay(history) == {"weights": first["weights"], "optimizer": first["optimizer"]}
    assert first["inner"] == first["optimizer"]
    assert (first["epoch"], first["batch"]) == (_train_keras.EPOCHS, 0)
    # Every batch once per epoch, in order: the resumed epoch went on at batch 2 and stopped at its end.
    for epoch in range(_train_keras.EPOCHS):
        assert [b for e, b, _ in history if e == epoch] == list(range(_train_keras.STEPS)), history
    assert len(history) == _train_keras.EPOCHS * _train_keras.STEPS
    # Without --max-np, epoch 1's first two batches ran at 3 ranks and the rest at 2.
    sizes = [2] * 8 if max_np == 2 else [3, 3, 2, 2, 2, 2, 2, 2]
    assert [len(ids) // _train_keras.BATCH for e, _, ids in history if e == 1] == sizes
    # A commit every 2 batches and at each epoch's end.
    assert first["commits"] == _train_keras.EPOCHS * (_train_keras.STEPS // 2 + 1)
