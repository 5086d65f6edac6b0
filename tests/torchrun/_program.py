"""A rank program for the torchrun tests: `torchrun --nproc-per-node N _program.py OUT MODE [DEVICE]`.

Modes: api (unison's Horovod-style API and torch.distributed on the "unison" backend, on tensors of
DEVICE, cpu unless given (tests/gpu gives cuda); results written to OUT/result-R), raise (rank 1 raises after one step), frozen (rank 1 stops itself with SIGSTOP),
restart (rank 1 raises in the launch's first attempt only), restart-pg (the same, the job formed by
init_process_group("unison") before hvd.init()). Every rank writes OUT/pid-R.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import unison.torch as hvd

out, mode = Path(sys.argv[1]), sys.argv[2]
device = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cpu")
torch.set_num_threads(1)
if mode == "restart-pg":
    dist.init_process_group("unison")
hvd.init()
rank, size = hvd.rank(), hvd.size()
if device.type == "cuda":
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
(out / f"pid-{rank}").write_text(str(os.getpid()))
if mode == "api":
    total = hvd.allreduce(torch.full((3,), float(rank + 1), device=device), op=hvd.Sum, name="total")
    gathered = hvd.allgather(torch.full((rank + 1,), float(rank), device=device), name="gathered")
    dist.init_process_group("unison")
    plain = torch.ones(2, device=device)
    dist.all_reduce(plain)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to(device))
    model(torch.ones(3, 4, device=device) * (rank + 1)).sum().backward()
    assert {total.device, gathered.device, plain.device, model.module.weight.grad.device} == {device}
    part = torch.full((2,), float(rank), device=device)  # a group of every rank but 0
    sub = dist.new_group(list(range(1, size))) if size > 1 else None
    if rank > 0:
        dist.all_reduce(part, group=sub)
    dist.barrier()  # rank 0 is in no call of the group's, but a rank that shuts down ends the job
    (out / f"result-{rank}").write_text(json.dumps({
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "total": total.tolist(),
        "gathered": gathered.tolist(), "plain": plain.tolist(), "part": part.tolist(), "grad": model.module.weight.grad[0].tolist(),
        "mpi4py": "mpi4py" in sys.modules, "grpc": "service_sequence_status" in hvd.statistics().backend}))
    dist.destroy_process_group()
    hvd.shutdown()
    sys.exit(0)
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(30):
    if step == 2 and rank == 1:
        if mode == "raise" or (mode.startswith("restart") and attempt == 0):
            raise ValueError(f"injected failure at step {step}")
        if mode == "frozen":
            (out / "fault-time").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
    hvd.allreduce(torch.ones(4), name=f"grad.{step % 3}")
    time.sleep(0.02)
(out / f"done-{rank}-{attempt}").write_text("ok")
hvd.shutdown()
