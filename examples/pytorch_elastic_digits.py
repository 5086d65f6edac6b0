"""Elastic training on scikit-learn's digits: the job survives a rank it loses and goes on from its last commit.

Run (three names of this machine stand for three hosts; any discovery script printing ``host:slots``
lines will do):

    printf 'localhost:1\\n127.0.0.1:1\\n%s:1\\n' "$(hostname)" > hosts.txt
    unisonrun -np 2 --min-np 1 --max-np 2 --host-discovery-script "cat hosts.txt" \\
        python examples/pytorch_elastic_digits.py --kill-at 20

The first membership epoch runs 2 ranks, on ``localhost`` and ``127.0.0.1`` (``--max-np 2``: the third
host waits). ``--kill-at N`` makes rank 1 of the first epoch SIGKILL itself after N steps, once: here
in the middle of epoch 0 (29 steps of 32 digits per rank). unisonrun names it (``rank 1 (127.0.0.1,
pid P) ended without shutting unison down (killed by signal 9 (SIGKILL))``), blacklists ``127.0.0.1``
and starts a new worker on the third host in its place; rank 0 keeps its process, the new worker
receives the last commit from it (a commit every step, ``--commit-every``), and training goes on.
Each digit is trained on exactly once per epoch across the reset (the ``ElasticSampler``), and rank 0
prints the accuracy on all 1797 digits after each of the 5 epochs (``--epochs``). Add or remove lines
in ``hosts.txt`` while it runs to watch the job grow (up to ``--max-np``) and shrink at its next commit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from sklearn.datasets import load_digits

import unison.torch as hvd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="digits per rank per step (default 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate per rank (scaled by the size)")
    parser.add_argument("--commit-every", type=int, default=1, help="commit every N steps (default 1)")
    parser.add_argument("--kill-at", type=int, default=-1, help="rank 1 of the first epoch dies after this many steps")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    features, labels = load_digits(return_X_y=True)
    x = torch.tensor(features / 16.0, dtype=torch.float32)
    y = torch.tensor(labels)
    dataset = list(range(len(x)))  # the sampler deals indices into x and y
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)

    def on_reset() -> None:  # a new epoch may have another size: keep the learning rate per rank
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            indices = list(state.train_sampler)  # after a reset: what this epoch has not yet trained on
            for batch in range((len(indices) + args.batch - 1) // args.batch):
                first_epoch = os.environ.get("UNISON_ELASTIC_EPOCH", "0") == "0"  # the membership epoch now
                if first_epoch and hvd.rank() == 1 and state.steps == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # a lost rank, as a preempted machine would be
                index = torch.tensor(indices[batch * args.batch:(batch + 1) * args.batch])
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
                optimizer.step()
                state.train_sampler.record_batch(batch, args.batch)
                state.steps += 1
                if state.steps % args.commit_every == 0:
                    state.commit()
            with torch.no_grad():
                accuracy = float((model(x).argmax(1) == y).float().mean())
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: accuracy {accuracy:.4f} on {hvd.size()} ranks, "
                      f"{state.steps} steps so far", flush=True)
            state.epoch += 1
            state.train_sampler.set_epoch(state.epoch)
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, steps=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
