"""Synthetic training throughput: unison.torch vs torch DDP (gloo) vs no communication, 2 ranks.

Run: mpiexec -n 2 python benchmarks/train_torch.py [--rounds 5] [--steps 20] [--quick] [--output PATH]

Each rank uses one thread. Runs alternate (unison, DDP, none, sync, mpi, unison, ...) so that machine noise
hits every mode alike; the table shows medians of samples/s over the rounds (global: both ranks'
samples) and each mode's share of the no-communication ceiling (``none``: the ranks never wait for
each other). ``sync`` is the same training without communication but with a barrier after every step:
the ceiling of any synchronous data-parallel method on this machine, since a step then lasts as long as
the slower rank's, and a step's compute time varies from step to step on a shared machine. ``mpi`` is
the floor for a reduction made with the same MPI: after ``backward()``, each gradient is reduced in
place with mpi4py, in the chunks unison uses, with no negotiation and no overlap; what separates it
from the ceiling is the CPU time MPICH itself needs to move and add the bytes. The load
average and the share of CPU time stolen by the hypervisor (`machine.py`) are printed; on a shared
machine, compare numbers only within one run. Rank 0 also writes everything it prints, with the samples
of every round, to ``benchmarks/results/train_torch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from machine import cpu_times, percent, steal_share
from mpi4py import MPI

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


CHUNK_ELEMENTS = 1 << 20  # 4 MiB of float32: unison's default UNISON_CHUNK_BYTES


def reduce_with_mpi(model: torch.nn.Module) -> None:
    """The ``mpi`` floor: average every gradient in place with blocking mpi4py calls, chunk by chunk."""
    size = MPI.COMM_WORLD.Get_size()
    for p in model.parameters():
        grad = p.grad
        assert grad is not None
        flat = grad.numpy().reshape(-1)
        for start in range(0, flat.size, CHUNK_ELEMENTS):
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, flat[start : start + CHUNK_ELEMENTS])
        grad.div_(size)


def run(mode: str, name: str, batch: int, steps: int) -> float:
    """Train `steps` steps in `mode`; return global samples per second (timed after 2 warm-up steps)."""
    torch.manual_seed(0)
    model = MODELS[name][0]()
    x, y = MODELS[name][1](batch)
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    forward: torch.nn.Module = model
    if mode == "unison":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif mode == "ddp":
        forward = torch.nn.parallel.DistributedDataParallel(model)
    for step in range(steps + 2):
        if mode == "sync":
            MPI.COMM_WORLD.Barrier()
        if step == 2:
            hvd.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        loss_of(name, forward(x), y).backward()
        if mode == "mpi":
            reduce_with_mpi(model)
        opt.step()
    hvd.barrier()
    return hvd.size() * batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 20; 3 with --quick)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--quick", action="store_true", help="one round of a few steps (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "train_torch.json"))
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    steps = args.steps or (3 if args.quick else 20)
    torch.set_num_threads(1)
    hvd.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    load_before, cpu_before = os.getloadavg(), cpu_times()
    modes = ["unison", "ddp", "none", "sync", "mpi"]
    names = args.models.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    params: dict[str, int] = {}
    for name in names:
        params[name] = sum(p.numel() for p in MODELS[name][0]().parameters())
        if hvd.rank() == 0:
            print(f"{name}: {params[name] / 1e6:.2f} M parameters, batch {args.batch_size} per rank", flush=True)
        for _ in range(rounds):
            for mode in modes:
                results.setdefault((name, mode), []).append(run(mode, name, args.batch_size, steps))
    load_after, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if hvd.rank() == 0:
        print(f"\n{hvd.size()} ranks, 1 thread each, {rounds} alternating rounds of {steps} steps;"
              f" load average before {load_before[0]:.2f}/{load_before[1]:.2f}, after "
              f"{load_after[0]:.2f}/{load_after[1]:.2f} (1/5 min); CPU steal {percent(steal)}")
        print(f"{'model':<8} {'unison':>10} {'ddp':>10} {'none':>10} {'sync':>10} {'mpi':>10} {'unison/none':>12}"
              f" {'ddp/none':>9} {'mpi/none':>9} {'unison/sync':>12} {'ddp/sync':>9} {'unison/ddp':>11}"
              f" {'unison/mpi':>11}")
        models = {}
        for name in names:
            med = {m: statistics.median(results[(name, m)]) for m in modes}
            print(f"{name:<8} {med['unison']:>10.1f} {med['ddp']:>10.1f} {med['none']:>10.1f} "
                  f"{med['sync']:>10.1f} {med['mpi']:>10.1f} {med['unison'] / med['none']:>12.0%} "
                  f"{med['ddp'] / med['none']:>9.0%} {med['mpi'] / med['none']:>9.0%} "
                  f"{med['unison'] / med['sync']:>12.0%} {med['ddp'] / med['sync']:>9.0%} "
                  f"{med['unison'] / med['ddp']:>10.2f}x {med['unison'] / med['mpi']:>10.2f}x")
            models[name] = {"parameters": params[name],
                            "samples_per_second": {m: results[(name, m)] for m in modes},
                            "median_samples_per_second": med,
                            "share_of_ceiling": {m: med[m] / med["none"] for m in ("unison", "ddp", "sync", "mpi")},
                            "share_of_sync_ceiling": {m: med[m] / med["sync"] for m in ("unison", "ddp")},
                            "unison_over_ddp": med["unison"] / med["ddp"],
                            "unison_over_mpi": med["unison"] / med["mpi"]}
        print("(samples/s, medians over rounds, global across ranks)")
        write_json(Path(args.output), {
            "ranks": hvd.size(), "threads_per_rank": 1, "rounds": rounds, "steps": steps,
            "batch_size": args.batch_size, "load_before": load_before, "load_after": load_after,
            "steal_share": steal,
            "models": models})
    dist.destroy_process_group()
    hvd.shutdown()


def write_json(path: Path, results: dict[str, object]) -> None:
    """Write `results` to `path` as indented JSON, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
