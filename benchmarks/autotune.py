"""Training throughput with autotune against the default settings, side by side in one run, 2 ranks.

Run: mpiexec -n 2 python benchmarks/autotune.py [--rounds 3] [--steps 30] [--models mlp] [--quick]

One engine serves a whole job, so the two sides cannot take turns step by step as in
``train_torch.py``: they take turns job by job. Each round starts unison twice in this process, once
with the default settings and once with ``UNISON_AUTOTUNE=1`` (which side goes first alternates by
round), trains the same model from the same seed with ``unison.torch.DistributedOptimizer``, and
times ``--steps`` steps, each after a barrier, keeping the slower rank's time. The tuned side first
trains untimed until autotune has settled (every rank reports it; the steps it took are printed),
then is timed with the parameters it chose. The table shows each side's median step over all rounds
as samples/s (global), the ratio, and the parameters each round chose. Nothing is asserted: on a
shared machine the noise is of the size of the differences, so the load average and the CPU steal
are printed with the numbers. Rank 0 writes everything to ``benchmarks/results/autotune.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from machine import cpu_times, percent, steal_share
from mpi4py import MPI
from train_torch import make_step

import unison
import unison.torch as hvd

SIDES = ("default", "tuned")
MAX_TUNING_STEPS = 2000


def run_side(side: str, name: str, batch: int, steps: int, warmup: int) -> dict[str, Any]:
    """Start unison for one side, train, and return its step times (rank 0: the slower rank's)."""
    world = MPI.COMM_WORLD
    if side == "tuned":
        os.environ["UNISON_AUTOTUNE"] = "1"
    else:
        os.environ.pop("UNISON_AUTOTUNE", None)
    hvd.init()
    step = make_step("unison", name, batch)
    tuning_steps = 0
    if side == "tuned":
        while True:  # every rank stops at the same step: the slowest to see "settled" decides
            stats = unison.statistics().autotune
            settled = stats is not None and stats.state == "settled"
            if world.allreduce(int(settled), op=MPI.MIN) or tuning_steps >= MAX_TUNING_STEPS:
                break
            step()
            tuning_steps += 1
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(steps):
        world.Barrier()
        start = time.perf_counter()
        step()
        seconds.append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
    stats = unison.statistics().autotune
    chosen = None if stats is None else dataclasses.asdict(stats)
    hvd.shutdown()
    return {"seconds": seconds, "tuning_steps": tuning_steps, "autotune": chosen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds of both sides (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="timed steps per side and round (default 30; 3 with --quick)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: one round, a few steps, samples of 2 steps")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "autotune.json"))
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (3 if args.quick else 30)
    warmup = 1 if args.quick else 3
    if args.quick:
        os.environ.setdefault("UNISON_AUTOTUNE_STEPS_PER_SAMPLE", "2")
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    load_before, cpu_before = os.getloadavg(), cpu_times()
    models: dict[str, object] = {}
    lines = []
    for name in args.models.split(","):
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for index in range(rounds):
            order = SIDES if index % 2 == 0 else SIDES[::-1]
            for side in order:
                runs[side].append(run_side(side, name, args.batch_size, steps, warmup))
        samples = world.Get_size() * args.batch_size
        rate = {side: samples / statistics.median([s for run in runs[side] for s in run["seconds"]])
                for side in SIDES}
        chosen = [run["autotune"] for run in runs["tuned"]]
        tuning = [run["tuning_steps"] for run in runs["tuned"]]
        models[name] = {"runs": runs, "median_samples_per_second": rate,
                        "tuned_over_default": rate["tuned"] / rate["default"]}
        lines.append(f"{name:<8} {rate['default']:>10.1f} {rate['tuned']:>10.1f} "
                     f"{rate['tuned'] / rate['default']:>8.2f}x  tuning steps {tuning}")
        for index, stats in enumerate(chosen):
            lines.append(f"         round {index}: {None if stats is None else stats['parameters']}")
    load_after, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if rank == 0:
        print(f"{world.Get_size()} ranks, 1 thread each, {rounds} rounds of {steps} timed steps per side, "
              f"sides alternating by round; load average before {load_before[0]:.2f}/{load_before[1]:.2f}, "
              f"after {load_after[0]:.2f}/{load_after[1]:.2f} (1/5 min); CPU steal {percent(steal)}")
        print(f"{'model':<8} {'default':>10} {'tuned':>10} {'ratio':>9}")
        print("\n".join(lines))
        print("(samples/s from the median step over all rounds, global across ranks)")
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "ranks": world.Get_size(), "rounds": rounds, "steps": steps, "warmup_steps": warmup,
            "batch_size": args.batch_size, "load_before": load_before, "load_after": load_after,
            "steal_share": steal, "models": models}, indent=1))


if __name__ == "__main__":
    main()
