"""Train softmax regression on scikit-learn's digits, data-parallel over unison's NumPy API.

Run: mpiexec -n 2 python examples/numpy_digits.py [--steps 150] [--lr 1.0]
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/numpy_digits.py``)

Every rank holds the same weights and a disjoint shard of the training set (rows rank::size). Each
step a rank computes the *sum* of its shard's per-example gradients; summing those across ranks and
dividing by the global example count gives exactly the full-batch gradient, whatever the shard sizes.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import unison as hvd

CLASSES = 10


def with_bias(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1))])


def shard_statistics(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return this shard's gradient sum and [loss sum, correct predictions, examples]."""
    logits = x @ w
    logits -= logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss_sum = -np.log(probabilities[rows, y]).sum()
    correct = (probabilities.argmax(axis=1) == y).sum()
    probabilities[rows, y] -= 1.0  # d(cross-entropy)/d(logits)
    return x.T @ probabilities, np.array([loss_sum, correct, len(y)], dtype=np.float64)


def global_accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray, name: str) -> float:
    correct = float((np.argmax(x @ w, axis=1) == y).sum())
    totals = hvd.allreduce(np.array([correct, len(y)]), op=hvd.Sum, name=name)
    return float(totals[0] / totals[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="full-batch gradient steps (default 150)")
    parser.add_argument("--lr", type=float, default=1.0, help="learning rate (default 1.0)")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        with_bias(digits.data / 16.0), digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    x_test_shard, y_test_shard = x_test[rank::size], y_test[rank::size]

    # Each rank draws different weights; the broadcast makes rank 0's everyone's starting point.
    w = np.random.default_rng(seed=rank).normal(scale=0.01, size=(x_train.shape[1], CLASSES))
    w = hvd.broadcast(w, root_rank=0, name="w0")
    if rank == 0:
        print(f"{size} ranks, {len(x_train)} training examples (~{len(x_shard)} per rank), "
              f"{len(x_test)} test examples; {args.steps} steps at lr {args.lr}")

    for step in range(1, args.steps + 1):
        gradient_sum, metrics = shard_statistics(w, x_shard, y_shard)
        gradient_sum = hvd.allreduce(gradient_sum, op=hvd.Sum, name="grad")
        loss_sum, correct, examples = hvd.allreduce(metrics, op=hvd.Sum, name="metrics")
        w -= args.lr * gradient_sum / examples
        if rank == 0 and (step == 1 or step % max(1, args.steps // 5) == 0):
            print(f"step {step:4d}  loss {loss_sum / examples:.4f}  train accuracy {correct / examples:.4f}")

    train_accuracy = global_accuracy(w, x_train[rank::size], y_train[rank::size], "train_accuracy")
    test_accuracy = global_accuracy(w, x_test_shard, y_test_shard, "test_accuracy")
    # Identical updates must leave identical weights: compare every rank's to rank 0's, bit for bit.
    difference = np.abs(w - hvd.broadcast(w, root_rank=0, name="w_final")).max()
    largest_difference = float(hvd.allreduce(np.array([difference]), op=hvd.Max, name="w_check")[0])
    hvd.shutdown()

    if rank == 0:
        print(f"final train accuracy {train_accuracy:.4f}  test accuracy {test_accuracy:.4f}")
        if largest_difference == 0.0:
            print(f"weights identical on all {size} ranks")
        else:
            print(f"ERROR: weights differ between ranks by up to {largest_difference:g}", file=sys.stderr)
    return 0 if largest_difference == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
