"""Compare op=Average and op=Adasum on scikit-learn's digits: the same model, data and learning rates.

Run: mpiexec -n 4 python examples/pytorch_adasum_digits.py [--steps 300] [--lrs 0.1,0.5,1.0,2.0]
(``. .venv/bin/activate`` first, or use ``.venv/bin/mpiexec``; Adasum needs 1, 2, 4, ... ranks.)

Each rank draws its own minibatches of ``--batch`` digits and trains a small MLP with plain SGD. With
``op=Average`` the ranks' gradients are averaged before each step. With ``op=Adasum`` each rank steps
on its own gradients and the parameters move by the Adasum of the ranks' changes: where the ranks'
updates agree it takes their common value (like Average), where they are orthogonal their sum. So at
one learning rate Adasum moves further per step than Average, and it also stops converging at a lower
learning rate. The table printed at the end shows both: loss and accuracy on all 1797 digits after
``--steps`` steps, for each op and learning rate.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from sklearn.datasets import load_digits

import unison.torch as hvd


def train(op: int, lr: float, steps: int, batch: int, seed: int) -> tuple[float, float]:
    """Train from the same initial weights on every rank; return (loss, accuracy) on all digits."""
    features, labels = load_digits(return_X_y=True)
    x = torch.tensor(features / 16.0, dtype=torch.float32)
    y = torch.tensor(labels)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), op=op)
    draw = torch.Generator().manual_seed(seed * 1000 + hvd.rank())  # each rank its own minibatches
    for _ in range(steps):
        index = torch.randint(0, len(x), (batch,), generator=draw)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
        opt.step()
    with torch.no_grad():
        logits = model(x)
        loss = float(torch.nn.functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(1) == y).float().mean())
    return loss, accuracy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="SGD steps per run (default 300)")
    parser.add_argument("--batch", type=int, default=16, help="digits per rank per step (default 16)")
    parser.add_argument("--lrs", default="0.1,0.5,1.0,2.0", help="learning rates, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rates = [float(v) for v in args.lrs.split(",")]
    rows = []
    for lr in rates:
        for label, op in (("Average", hvd.Average), ("Adasum", hvd.Adasum)):
            loss, accuracy = train(op, lr, args.steps, args.batch, args.seed)
            rows.append((label, lr, loss, accuracy))
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks x {args.batch} digits per step, {args.steps} SGD steps")
        print(f"{'op':8} {'lr':>6} {'loss':>8} {'accuracy':>9}")
        for label, lr, loss, accuracy in rows:
            shown = f"{loss:8.4f}" if math.isfinite(loss) else f"{'diverged':>8}"
            print(f"{label:8} {lr:6.2f} {shown} {accuracy:9.4f}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
