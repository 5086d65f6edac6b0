"""Synthetic training throughput with unison.torch (img/sec), after Horovod's synthetic benchmark.

Run: mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py [--batch-size 32] [--num-iters 10]
                                                                [--device cpu|cuda]
(with the virtual environment active: ``. .venv/bin/activate`` after ``make venv``; or by path:
``.venv/bin/mpiexec -n 2 .venv/bin/python examples/pytorch_synthetic_benchmark.py``)

The model is defined here (a small ResNet-style convnet) so nothing is downloaded. With
``--device cuda`` each rank uses the GPU numbered by its local rank; timings then wait for the GPU.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from _torch_device import rank_device, require_cuda

import unison.torch as hvd


class Block(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class SmallResNet(torch.nn.Module):
    def __init__(self, classes: int = 100, width: int = 64) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.blocks = torch.nn.Sequential(Block(width), Block(width))
        self.fc = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="run on the CPU, or on the GPU numbered by each rank's local rank")
    args = parser.parse_args()

    require_cuda(args.device)
    hvd.init()
    device = rank_device(args.device)
    torch.set_num_threads(1)
    model = SmallResNet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 100, (args.batch_size,), device=device)

    def benchmark_step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # time the GPU's work, not only its launch

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: SmallResNet, batch size {args.batch_size}, ranks {hvd.size()}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
