"""The training scripts the Ray and Spark tests run on every rank: the same steps on gloo and on unison.

Pickled by value (the workers need not import ``tests``): every import is inside the functions.
"""

from __future__ import annotations

from typing import Any

STEPS = 6
BATCH = 16


def _model_and_data(rank: int) -> tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(0)  # the same initial parameters on every rank
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    x = torch.randn(STEPS, BATCH, 5, generator=generator)
    y = x.sum(dim=2, keepdim=True).sin()
    return model, x, y


def ddp_steps(backend: str) -> list[float]:
    """Train with DistributedDataParallel on `backend` in a process whose environment carries torch's
    env:// variables (or whose process group is already up); this rank's parameters, flattened."""
    import torch
    import torch.distributed as dist

    if backend == "unison":
        import unison.torch  # noqa: F401  (registers the backend)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    model, x, y = _model_and_data(dist.get_rank())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[step]), y[step]).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def horovod_steps() -> list[float]:
    """The same steps with Horovod's API (``hvd.DistributedOptimizer``): gradients averaged as DDP does."""
    import torch

    import unison.torch as hvd

    hvd.init()
    model, x, y = _model_and_data(hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[step]), y[step]).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def desync() -> str:
    """A step whose metrics all-reduce has 3 values on rank 1 and 2 elsewhere; the error each rank sees."""
    import torch
    import torch.distributed as dist

    import unison.torch  # noqa: F401  (registers the backend)

    if not dist.is_initialized():
        dist.init_process_group("unison")
    metrics = torch.ones(3 if dist.get_rank() == 1 else 2)
    dist.all_reduce(metrics)
    return "no error"


def write_outcome(directory: str, name: str, call: Any) -> Any:
    """Run `call()` and write what this rank saw to ``directory/name-RANK.json`` (its value, or its
    exception's type and message), then return the value or raise the exception again."""
    import json
    import os

    rank = os.environ.get("RANK", "?")
    try:
        value = call()
    except Exception as exc:
        with open(os.path.join(directory, f"{name}-{rank}.json"), "w") as out:
            json.dump({"error": type(exc).__name__, "message": str(exc)}, out)
        raise
    with open(os.path.join(directory, f"{name}-{rank}.json"), "w") as out:
        json.dump({"value": value}, out)
    return value


def initial_parameters() -> list[float]:
    """The parameters before any step (rank 0's initial model): a run must move away from them."""
    import torch

    model, _, _ = _model_and_data(0)
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
