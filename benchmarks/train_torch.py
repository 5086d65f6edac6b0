"""Synthetic training throughput: unison.torch vs torch DDP (gloo) vs plain MPI vs no communication, 2 ranks.

Run: mpiexec -n 2 python benchmarks/train_torch.py [--steps 60] [--quick] [--output PATH]

Each rank uses one thread. Every mode has its own copy of the model, and the modes take turns step by
step (unison, DDP, none, mpi, then the same rotated by one, ...), each step starting after a barrier:
the noise of a shared machine, which moves the speed of a whole run by 10% or more within a minute,
then hits every mode alike. A step's time is the slower rank's; the table shows each mode's median
step as samples/s (global: both ranks' samples) and as a share of ``none``.

* ``none``: the same step without communication: the ceiling of any synchronous data-parallel method
  (each step lasts as long as the slower rank's computation).
* ``mpi``: after ``backward()``, each gradient is averaged in place with blocking mpi4py calls, in the
  chunks unison uses; no negotiation, no overlap. What separates it from ``none`` is the CPU time
  MPICH itself needs to move and add the bytes: a floor for any method built on the same MPI.
* ``unison``: ``hvd.DistributedOptimizer`` with its defaults; ``ddp``: torch's
  ``DistributedDataParallel`` over gloo.

The load average and the share of CPU time stolen by the hypervisor (`machine.py`) are printed; on a
shared machine, compare numbers only within one run. Rank 0 also writes everything it prints, with
the time of every step, to ``benchmarks/results/train_torch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from machine import cpu_times, percent, steal_share
from turns import average_in_place, take_turns

import unison.torch as hvd


def mlp() -> torch.nn.Module:
    """About 11.5 M parameters: communication-heavy at batch 32."""
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 512))


def convnet() -> torch.nn.Module:
    """About 1.3 M parameters: compute-heavy."""
    def block(i: int, o: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]
    return torch.nn.Sequential(*block(3, 64), torch.nn.MaxPool2d(2), *block(64, 128), torch.nn.MaxPool2d(2),
                               *block(128, 256), *block(256, 256), *block(256, 128),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))


MODELS = {
    "mlp": (mlp, lambda b: (torch.randn(b, 1024), torch.randn(b, 512))),
    "convnet": (convnet, lambda b: (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,)))),
}


def loss_of(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target) if name == "mlp" else F.cross_entropy(out, target)


def reduce_with_mpi(model: torch.nn.Module) -> None:
    """The ``mpi`` mode: average every gradient in place with blocking mpi4py calls, chunk by chunk."""
    for p in model.parameters():
        assert p.grad is not None
        average_in_place(p.grad.numpy())


MODES = ("unison", "ddp", "none", "mpi")


def make_step(mode: str, name: str, batch: int) -> Callable[[], None]:
    """One training step of `name` in `mode`, on a model of its own (same seed in every mode)."""
    torch.manual_seed(0)
    model = MODELS[name][0]()
    x, y = MODELS[name][1](batch)
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    forward: torch.nn.Module = model
    if mode == "unison":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif mode == "ddp":
        forward = torch.nn.parallel.DistributedDataParallel(model)

    def step() -> None:
        opt.zero_grad()
        loss_of(name, forward(x), y).backward()
        if mode == "mpi":
            reduce_with_mpi(model)
        opt.step()

    return step


def measure(name: str, batch: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per step of every mode, taking turns step by step; on rank 0, the slower rank's time."""
    return take_turns({mode: make_step(mode, name, batch) for mode in MODES}, steps, warmup) or {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="timed steps per mode (default 60; 3 with --quick)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--quick", action="store_true", help="a few steps (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "train_torch.json"))
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 60)
    warmup = 1 if args.quick else 3
    torch.set_num_threads(1)
    hvd.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    load_before, cpu_before = os.getloadavg(), cpu_times()
    names = args.models.split(",")
    step_seconds: dict[str, dict[str, list[float]]] = {}
    params: dict[str, int] = {}
    for name in names:
        params[name] = sum(p.numel() for p in MODELS[name][0]().parameters())
        if hvd.rank() == 0:
            print(f"{name}: {params[name] / 1e6:.2f} M parameters, batch {args.batch_size} per rank", flush=True)
        step_seconds[name] = measure(name, args.batch_size, steps, warmup)
    load_after, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if hvd.rank() == 0:
        samples = hvd.size() * args.batch_size
        print(f"\n{hvd.size()} ranks, 1 thread each, {steps} steps per mode taking turns step by step;"
              f" load average before {load_before[0]:.2f}/{load_before[1]:.2f}, after "
              f"{load_after[0]:.2f}/{load_after[1]:.2f} (1/5 min); CPU steal {percent(steal)}")
        print(f"{'model':<8} {'unison':>10} {'ddp':>10} {'none':>10} {'mpi':>10} {'unison/none':>12}"
              f" {'ddp/none':>9} {'mpi/none':>9} {'unison/ddp':>11} {'unison/mpi':>11}")
        models = {}
        for name in names:
            med = {m: samples / statistics.median(step_seconds[name][m]) for m in MODES}
            print(f"{name:<8} {med['unison']:>10.1f} {med['ddp']:>10.1f} {med['none']:>10.1f} {med['mpi']:>10.1f}"
                  f" {med['unison'] / med['none']:>12.0%} {med['ddp'] / med['none']:>9.0%}"
                  f" {med['mpi'] / med['none']:>9.0%} {med['unison'] / med['ddp']:>10.2f}x"
                  f" {med['unison'] / med['mpi']:>10.2f}x")
            models[name] = {"parameters": params[name],
                            "step_seconds": step_seconds[name],
                            "median_samples_per_second": med,
                            "share_of_ceiling": {m: med[m] / med["none"] for m in ("unison", "ddp", "mpi")},
                            "unison_over_ddp": med["unison"] / med["ddp"],
                            "unison_over_mpi": med["unison"] / med["mpi"]}
        print("(samples/s from the median step, global across ranks)")
        write_json(Path(args.output), {
            "ranks": hvd.size(), "threads_per_rank": 1, "alternation": "step", "steps": steps,
            "warmup_steps": warmup, "batch_size": args.batch_size, "load_before": load_before,
            "load_after": load_after, "steal_share": steal, "models": models})
    dist.destroy_process_group()
    hvd.shutdown()


def write_json(path: Path, results: dict[str, object]) -> None:
    """Write `results` to `path` as indented JSON, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
