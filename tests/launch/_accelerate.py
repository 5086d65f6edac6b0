"""An Accelerate script for the launch tests: ``accelerate launch --cpu --num_processes 2 _accelerate.py OUT BACKEND [desync]``.

On the CPU Accelerate picks gloo itself (or MPI) and refuses another backend by name, so the script makes
the default group first, ``dist.init_process_group(BACKEND)``, and ``Accelerator(cpu=True)`` takes it as
it is. Each rank trains three steps and writes OUT/params-R, or OUT/error-R when a collective fails; with
``desync`` rank 1 gathers one metric more than rank 0.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator

import unison.torch  # noqa: F401 - registers the backend

OUT, BACKEND = Path(sys.argv[1]), sys.argv[2]
DESYNC = "desync" in sys.argv[3:]
warnings.filterwarnings("ignore")


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group(BACKEND)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(24, 6, generator=torch.Generator().manual_seed(1)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    rank = accelerator.process_index
    try:
        for step, (batch,) in enumerate(loader):
            if step == 3:
                break
            accelerator.backward(model(batch).square().mean())
            opt.step()
            opt.zero_grad()
            if DESYNC and rank == 1 and step == 1:
                accelerator.gather(torch.ones(3))  # one gather more than rank 0
        accelerator.wait_for_everyone()
    except Exception as exc:  # noqa: BLE001 - written for the test, then raised
        (OUT / f"error-{rank}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    (OUT / f"params-{rank}").write_text(json.dumps({
        "params": [p.detach().reshape(-1).tolist() for p in accelerator.unwrap_model(model).parameters()],
        "metric": 1.0, "backend": dist.get_backend(), "size": dist.get_world_size(), "rank": dist.get_rank()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
