"""Train a small CNN on scikit-learn's 8x8 digits on a Ray cluster, with Horovod's RayExecutor or Ray Train.

Run: python examples/ray_digits.py [--workers 2] [--epochs 4] [--launcher executor|ray-train]
     (starts a local Ray cluster of --workers CPUs; --address ADDRESS joins a running one)

``--launcher executor`` is a Horovod-on-Ray script whose only change is the import line:
``from unison.ray import RayExecutor``. Each worker runs ``train`` with ``unison.torch``'s
``DistributedOptimizer``. ``--launcher ray-train`` runs plain ``torch.distributed`` code through Ray
Train's ``TorchTrainer`` with ``torch_config=unison.ray.TorchConfig()``: DDP on the "unison" backend.
Either way each rank trains on its shard (rows rank::size) and rank 0 prints the loss and the
accuracy over the whole test set after each epoch, then the driver prints the final accuracy.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any


def data(rank: int, size: int) -> tuple[Any, Any, Any, Any]:
    """This rank's shard of the training digits, and the whole test set, as tensors."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    return x_train[rank::size], y_train[rank::size], x_test, y_test


def model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))


def epochs_of(net: Any, optimizer: Any, shard: tuple[Any, Any, Any, Any], epochs: int, rank: int) -> float:
    """Train `epochs` over the shard in batches of 32; the test accuracy after the last."""
    import torch
    import torch.nn.functional as F

    x, y, x_test, y_test = shard
    accuracy = 0.0
    for epoch in range(epochs):
        for start in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x[start:start + 32]), y[start:start + 32])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = float((net(x_test).argmax(1) == y_test).float().mean())
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}", flush=True)
    return accuracy


def train_with_horovod_api(epochs: int) -> float:
    """What each RayExecutor worker runs: Horovod's API on unison."""
    import torch

    import unison.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1 * hvd.size(), momentum=0.5),
                                         named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    return epochs_of(net, optimizer, data(hvd.rank(), hvd.size()), epochs, hvd.rank())


def train_with_ddp(config: dict[str, Any]) -> Any:
    """What each Ray Train worker runs: torch.distributed code; Ray Train started the process group."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, size = dist.get_rank(), dist.get_world_size()
    net = torch.nn.parallel.DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1 * size, momentum=0.5)
    return epochs_of(net, optimizer, data(rank, size), config["epochs"], rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--launcher", choices=["executor", "ray-train"], default="executor")
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    args = parser.parse_args()

    import ray

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level=logging.WARNING)
    if args.launcher == "executor":
        from unison.ray import RayExecutor

        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.workers)
        executor.start()
        try:
            accuracy = executor.run(train_with_horovod_api, kwargs={"epochs": args.epochs})[0]
        finally:
            executor.shutdown()
    else:
        import tempfile

        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from unison.ray import TorchConfig

        trainer = TorchTrainer(train_with_ddp, train_loop_config={"epochs": args.epochs},
                               torch_config=TorchConfig(), scaling_config=ScalingConfig(num_workers=args.workers),
                               run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-digits-")))
        result: Any = trainer.fit()
        accuracy = result.return_value  # rank 0's
    print(f"final test accuracy: {accuracy:.3f}")


if __name__ == "__main__":
    main()
