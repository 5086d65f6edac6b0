"""Train a small CNN on scikit-learn's bundled 8x8 digits with unison.torch (real data, no download).

Run: mpiexec -n 2 python examples/pytorch_mnist.py [--epochs 8] [--checkpoint checkpoints/pytorch_digits.pt]
                                                  [--compression none|fp16|bf16|topk|powersgd|partial]
                                                  [--device cpu|cuda]
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/pytorch_mnist.py``)

Each rank trains on its own shard of the training set (rows rank::size); DistributedOptimizer
averages gradients, rank 0 prints per-epoch loss/accuracy (summed over every rank's shard, then
divided, so the numbers are exact) and saves a checkpoint atomically (temp file, fsync, rename).
With ``--device cuda`` each rank trains on the GPU numbered by its local rank and gradients are
reduced on the GPUs (NCCL; install the ``gpu-cuda12`` or ``gpu-cuda13`` extra, docs/gpu.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from _torch_device import rank_device, require_cuda
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import unison.torch as hvd

# Each choice, and what travels per step instead of every float32 gradient (docs/compression.md).
COMPRESSION = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,  # 2-byte gradients, summed in float32
    "bf16": lambda: hvd.Compression.bf16,
    "topk": lambda: hvd.Compression.topk(0.01),  # the largest 1% of each gradient, rest kept for later
    "powersgd": lambda: hvd.Compression.powersgd(2),  # rank-2 factors of each weight matrix
    "partial": lambda: hvd.Compression.partial(0.25),  # average a quarter of the parameters per step
}


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


def save_atomically(state: dict, path: str) -> None:
    """Write to a temporary file in the same directory, fsync it, then rename over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ckpt-")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Exact global loss and accuracy: sums and counts are reduced, not per-rank ratios."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        totals = torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                               (logits.argmax(1) == y).sum().item(), float(len(y))], dtype=torch.float64)
    model.train()
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval.totals")
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="checkpoints/pytorch_digits.pt")
    parser.add_argument("--compression", choices=sorted(COMPRESSION), default="none",
                        help="how gradients travel between ranks")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="train on the CPU, or on the GPU numbered by each rank's local rank")
    args = parser.parse_args()

    require_cuda(args.device)
    hvd.init()
    device = rank_device(args.device)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    x_test, y_test = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]
    x_train, y_train, x_test, y_test = (t.to(device) for t in (x_train, y_train, x_test, y_test))

    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPRESSION[args.compression]())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    # every rank must run the same number of steps: the smallest shard decides
    steps = int(hvd.allreduce(torch.tensor([len(x_train) // args.batch_size]), op=hvd.Min).item())
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            rows = order[step * args.batch_size : (step + 1) * args.batch_size].to(device)
            opt.zero_grad()
            F.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
            opt.step()
        train_loss, train_acc = evaluate(model, x_train, y_train)
        test_loss, test_acc = evaluate(model, x_test, y_test)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f} acc {train_acc:.3f} | "
                  f"test loss {test_loss:.4f} acc {test_acc:.3f}", flush=True)
            save_atomically({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()},
                            args.checkpoint)
    if hvd.rank() == 0 and args.compression != "none":
        stats = opt.statistics()
        print(f"{args.compression}: sent {stats['payload_bytes'] / max(stats['dense_bytes'], 1):.1%} of the "
              "gradient bytes", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
