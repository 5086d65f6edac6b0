"""A DDP rank program on the "unison" backend: `python _ddp_scenario.py PIDDIR MODE FAILING_RANK`.

Every rank writes its pid to PIDDIR/pid-R and trains a small DDP model; at step 3 the failing rank
misbehaves: `extra` issues one more all_reduce of another shape first (a rank out of step), `stuck`
sleeps in its own code instead of the step, `raise` raises. The failing rank writes the time of the fault to PIDDIR/fault-time; every rank writes PIDDIR/finally-R.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import unison.torch  # noqa: F401 - registers the backend

pid_dir, mode, failing = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("unison")
rank = dist.get_rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(200):
        if step == 3 and rank == failing:
            (pid_dir / "fault-time").write_text(repr(time.time()))
            if mode == "extra":
                dist.all_reduce(torch.ones(5))  # a metric on this rank only: out of step from here
            if mode == "stuck":
                time.sleep(120)
            if mode == "raise":
                raise ValueError(f"injected failure at step {step}")
        opt.zero_grad()
        model(torch.randn(16, 8)).sum().backward()
        opt.step()
        time.sleep(0.02)
finally:
    (pid_dir / f"finally-{rank}").write_text("ran")
