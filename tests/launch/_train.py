"""A rank program for the launch tests: DDP trained a few steps, started in one of the ways torch jobs start.

``python _train.py OUT FORM BACKEND [desync]``. FORM says how the processes start and meet:
``spawn-tcp``, ``spawn-file``, ``spawn-env`` (MASTER_ADDR/MASTER_PORT set, rank and world size passed),
``spawn-envvars`` (RANK and WORLD_SIZE in each process's environment, nothing passed), ``spawn-store``
(an explicit TCPStore): this process starts two with ``torch.multiprocessing.spawn``; ``hand``: the test
started this process with torch's env:// variables and it calls ``init_process_group(BACKEND)``;
``hand-hvd``: the same, but ``hvd.init()`` comes first. Each rank writes OUT/params-R (its parameters
after training, as JSON lists) or, when a collective fails, OUT/error-R (the error's type and message).
With ``desync`` rank 1 issues one ``all_reduce`` more than rank 0.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

SIZE = 2
STEPS = 3


def train(rank: int, out: Path, backend: str, desync: bool) -> None:
    """DDP on a small model, the same data on every run: what every rank ends with goes to OUT."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(STEPS):
            data = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + rank))
            model(data).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if desync and rank == 1 and step == 1:
                dist.all_reduce(torch.ones(3))  # one call more than rank 0
        metric = torch.tensor([float(rank)])
        dist.all_reduce(metric)
    except Exception as exc:  # noqa: BLE001 - written for the test, then raised
        (out / f"error-{rank}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    (out / f"params-{rank}").write_text(json.dumps({
        "params": [p.detach().reshape(-1).tolist() for p in model.parameters()], "metric": metric.item(),
        "backend": dist.get_backend(), "size": dist.get_world_size(), "rank": dist.get_rank()}))


def spawned(rank: int, out: str, form: str, backend: str, desync: bool, where: str) -> None:
    """One process of ``mp.spawn``: meet the other as FORM says, then train."""
    import unison.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    if form == "spawn-tcp":
        dist.init_process_group(backend, init_method=f"tcp://{where}", rank=rank, world_size=SIZE)
    elif form == "spawn-file":
        dist.init_process_group(backend, init_method=f"file://{where}", rank=rank, world_size=SIZE)
    elif form == "spawn-env":
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=SIZE)
    elif form == "spawn-envvars":
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(SIZE))
        dist.init_process_group(backend)
    elif form == "spawn-store":
        host, port = where.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), SIZE, is_master=rank == 0, timeout=timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=SIZE)
    train(rank, Path(out), backend, desync)
    dist.destroy_process_group()


def main() -> None:
    out, form, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    desync = "desync" in sys.argv[4:]
    where = os.environ.get("LAUNCH_TEST_WHERE", "")
    if form.startswith("spawn"):
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(out, form, backend, desync, where), nprocs=SIZE)
        return
    import unison.torch as hvd

    torch.set_num_threads(1)
    if form == "hand-hvd":
        hvd.init()
    dist.init_process_group(backend)
    train(dist.get_rank(), Path(out), backend, desync)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
