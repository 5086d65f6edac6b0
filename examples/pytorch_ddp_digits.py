"""Train a small CNN on scikit-learn's 8x8 digits with plain torch DDP on the "unison" backend.

Run: unisonrun -np 2 python examples/pytorch_ddp_digits.py [--epochs 8] [--device cpu|cuda]
     (or: mpiexec -n 2 python examples/pytorch_ddp_digits.py, or torchrun --nproc-per-node 2 ...)

The script is torch.distributed code as written for gloo or NCCL; the only unison lines are the
import and the backend's name. Each rank trains on its shard (rows rank::world_size) through
``DistributedDataParallel``; every collective runs through unison's engine, so a rank that issues a
different collective at the same point (try ``--desync``: rank 1 all_reduces one extra metric in
epoch 3) fails on every rank at once, instead of waiting for a watchdog, with a MismatchError that
gives each call's shape and the ranks that made it (``[2] on rank [0]; [3] on rank [1]``) and the line
of this script where each rank made its call (``Called at pytorch_ddp_digits.py:L in main <- ... on
rank [0]; ...``, rank 1's line the extra call's). unisonrun reports it once and names each rank's
line, rank 1's extra call first; under plain mpiexec rank 0 reports it and every other rank prints its
own line; torchrun names rank 1 as the "Root Cause". Rank 0 prints the loss and the
accuracy over the whole test set each epoch. With
``--device cuda`` each rank trains on the GPU numbered by its local rank, and DDP's gradients go
through unison's GPU data plane (NCCL).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _torch_device import rank_device, require_cuda
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import unison.torch  # noqa: F401 - registers the "unison" backend


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--desync", action="store_true", help="rank 1 issues one extra all_reduce in epoch 3")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="train on the CPU, or on the GPU numbered by each rank's local rank")
    args = parser.parse_args()
    require_cuda(args.device)
    torch.set_num_threads(1)
    dist.init_process_group("unison")  # rank and world size come from the launch
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device(args.device)

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = (torch.as_tensor(a) for a in
                                        train_test_split(x.numpy(), y.numpy(), test_size=0.2, random_state=0))
    x_train, y_train = x_train[rank::world].to(device), y_train[rank::world].to(device)
    x_test, y_test = x_test.to(device), y_test.to(device)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net().to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * world, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        steps = len(x_train) // args.batch_size  # the same on every rank: shards differ by one row at most
        total = torch.zeros(2, device=device)
        for step in range(steps):
            index = order[step * args.batch_size:(step + 1) * args.batch_size].to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[index]), y_train[index])
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        if args.desync and epoch == 2 and rank == 1:
            dist.all_reduce(torch.ones(3, device=device))  # a metric on this rank only: out of step from here
        dist.all_reduce(total)
        model.eval()
        with torch.no_grad():
            correct = (model(x_test).argmax(1) == y_test).sum()
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {total[0] / total[1]:.4f} "
                  f"test acc {correct.item() / len(y_test):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
