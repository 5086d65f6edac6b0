"""Train a click-through-rate model whose embedding table lives on parameter servers (PyTorch).

Run (with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``):
    unisonrun -np 2 --pservers 1 python examples/ps_ctr.py --steps 50
or by path: ``.venv/bin/unisonrun -np 2 --pservers 1 .venv/bin/python examples/ps_ctr.py --steps 50``

The data are synthetic: each sample has FIELDS categorical fields (ids of one shared table, each
field its own id range) and is a click with probability sigmoid(sum of hidden per-id weights). The
model sums the fields' rows (`DistributedEmbedding(mode="sum")`) into a small MLP. The servers hold
the table (Adagrad, rows made on first use) and the MLP's parameters (Adam); each trainer pulls only
the rows of its batch's unique ids and pushes only their gradients. Every trainer prints the log
loss on the same held-out set before and after training; it falls from about 0.69.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

import unison.ps as ps
import unison.ps.torch as pst

FIELDS = 4
IDS_PER_FIELD = 250


class Clicks:
    """Synthetic click data: the hidden weights are the same on every trainer (one seed)."""

    def __init__(self) -> None:
        self.hidden = np.random.default_rng(0).normal(0.0, 1.0, FIELDS * IDS_PER_FIELD)

    def batch(self, rng: np.random.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = rng.integers(0, IDS_PER_FIELD, size=(size, FIELDS)) + IDS_PER_FIELD * np.arange(FIELDS)
        p = 1.0 / (1.0 + np.exp(-self.hidden[ids].sum(1)))
        clicks = (rng.random(size) < p).astype(np.float32)
        return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(clicks).unsqueeze(1)


def log_loss(model: nn.Module, ids: torch.Tensor, clicks: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.binary_cross_entropy_with_logits(model(ids), clicks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256, help="per trainer")
    args = parser.parse_args()

    client = ps.init()  # a server serves here until every trainer finished, then exits
    torch.manual_seed(0)
    model = nn.Sequential(
        pst.DistributedEmbedding("fields", FIELDS * IDS_PER_FIELD, 8, mode="sum", optimizer=ps.Adagrad(0.1)),
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = pst.ServerOptimizer(model, ps.Adam(0.01))
    data = Clicks()
    held_out = data.batch(np.random.default_rng(12345), 2048)
    rng = np.random.default_rng(1 + client.trainer)  # each trainer its own samples
    tag = f"trainer {client.trainer}"
    print(f"{tag} initial held-out log loss {log_loss(model, *held_out):.4f}", flush=True)
    for step in range(1, args.steps + 1):
        ids, clicks = data.batch(rng, args.batch_size)
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(ids), clicks)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"{tag} step {step} batch log loss {loss.item():.4f}", flush=True)
    stats = client.statistics()
    print(f"{tag} final held-out log loss {log_loss(model, *held_out):.4f} "
          f"({stats['bytes_sent'] / args.steps / 1024:.1f} KiB sent per step)", flush=True)
    ps.shutdown()


if __name__ == "__main__":
    main()
