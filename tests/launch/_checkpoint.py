"""A rank program for the compile and checkpoint tests: ``python _checkpoint.py OUT BACKEND CHECK``.

Two processes started by ``torch.multiprocessing.spawn`` meet over tcp:// (LAUNCH_TEST_WHERE). CHECK:
``compile`` trains ``torch.compile(DDP(model))`` three steps; ``fsdp`` trains an FSDP2 model three steps
with Adam, then takes the full model and optimizer state dicts (full_state_dict, cpu_offload), a
parameter's ``full_tensor()``, and saves and loads a distributed checkpoint (``torch.distributed.checkpoint``)
under OUT/ckpt. Each rank writes what it ended with to OUT/result-R (JSON).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + rank))


def flat(tensors: Any) -> list[float]:
    return [float(x) for t in tensors for x in t.detach().reshape(-1)]


def compiled(rank: int) -> dict[str, Any]:
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    step_fn = torch.compile(ddp, backend="aot_eager")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        step_fn(batch(step, rank)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return {"params": flat(net.parameters())}


def fsdp(rank: int, out: Path) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    net = fully_shard(model())
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    for step in range(3):
        net(batch(step, rank)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(net, options=options)
    optim = get_optimizer_state_dict(net, opt, options=options)
    full = net[0].weight.full_tensor()
    dcp.save({"model": net.state_dict()}, checkpoint_id=str(out / "ckpt"))
    saved = {k: v.full_tensor().clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    loaded = {"model": net.state_dict()}
    dcp.load(loaded, checkpoint_id=str(out / "ckpt"))
    back = {k: v.full_tensor() for k, v in net.state_dict().items()}
    return {"model": {k: flat([v]) for k, v in state.items()},
            "optim": {str(k): {n: flat([v]) if isinstance(v, torch.Tensor) else v for n, v in s.items()}
                      for k, s in optim.get("state", {}).items()},
            "full": flat([full]), "roundtrip": all(torch.equal(saved[k], back[k]) for k in saved)}


def spawned(rank: int, out: str, backend: str, check: str, where: str) -> None:
    import unison.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://{where}", rank=rank, world_size=2)
    result = compiled(rank) if check == "compile" else fsdp(rank, Path(out))
    Path(out, f"result-{rank}").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(spawned, args=(sys.argv[1], sys.argv[2], sys.argv[3], os.environ["LAUNCH_TEST_WHERE"]), nprocs=2)
