"""Small collectives back to back: what one call costs, side by side with the transport it runs on.

Run: ``mpiexec -n 2 python benchmarks/latency.py [--calls 300] [--rounds 8] [--quick] [--output PATH]``

Each side makes `--calls` calls in a row with no barrier between them (the calls of a training step,
a metric in a loop), and a round times them one by one; the sides take turns round by round, so that a
busy spell of the machine hits every side alike. Sides: raw mpi4py ``Allreduce`` and unison's
``hvd.allreduce`` (named, so its response is cached: the steady state) at 4 KiB and 64 KiB, and
``dist.all_reduce`` of 4 KiB on the ``unison`` backend and on ``gloo``. Reported per side: the median
call over all rounds, each round's median (p50) and 90th percentile (p90), and the worst round's
p90/p50 (a call that switches between a fast and a slow mode shows there); per pair, the ratio of the
medians. The load average before and after is recorded. Rank 0 writes
``benchmarks/results/latency.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from machine import cpu_times, percent, steal_share
from mpi4py import MPI

import unison as hvd

KiB = 1024
PAIRS = (("hvd.allreduce 4 KiB", "mpi4py Allreduce 4 KiB"), ("hvd.allreduce 64 KiB", "mpi4py Allreduce 64 KiB"),
         ("dist.all_reduce 4 KiB unison", "dist.all_reduce 4 KiB gloo"))


def sides(comm: MPI.Comm, with_torch: bool) -> dict[str, Callable[[], object]]:
    """One call of each side, on buffers made once."""
    made: dict[str, Callable[[], object]] = {}
    for nbytes in (4 * KiB, 64 * KiB):
        label = f"{nbytes // KiB} KiB"
        x = np.ones(nbytes // 4, dtype=np.float32)
        y = np.empty_like(x)
        made[f"mpi4py Allreduce {label}"] = functools.partial(comm.Allreduce, x, y)
        made[f"hvd.allreduce {label}"] = functools.partial(hvd.allreduce, x, name=f"latency.{nbytes}", op=hvd.Sum)
    if with_torch:
        import torch
        import torch.distributed as dist

        import unison.torch  # noqa: F401 - registers the unison backend

        if not dist.is_initialized():
            dist.init_process_group("unison")
        tensor = torch.ones(KiB)
        for backend in ("unison", "gloo"):
            group = dist.new_group(backend=backend)
            made[f"dist.all_reduce 4 KiB {backend}"] = functools.partial(dist.all_reduce, tensor, group=group)
    return made


def one_round(call: Callable[[], object], calls: int) -> list[float]:
    """Seconds of each of `calls` calls in a row."""
    times = []
    clock = time.perf_counter
    for _ in range(calls):
        start = clock()
        call()
        times.append(clock() - start)
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per side (alternated)")
    parser.add_argument("--no-torch", action="store_true", help="leave out the dist.all_reduce sides")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 100 calls (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "latency.json"))
    args = parser.parse_args()
    calls, rounds = (100, 3) if args.quick else (args.calls, args.rounds)

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    made = sides(comm, not args.no_torch)
    load_before, cpu_before = os.getloadavg(), cpu_times()
    for call in made.values():  # warm-up: negotiate once, fill caches, make the groups' buffers
        one_round(call, 20)
    per_round: dict[str, list[list[float]]] = {name: [] for name in made}
    for index in range(rounds):
        order = list(made) if index % 2 == 0 else list(reversed(made))
        for name in order:
            comm.Barrier()
            per_round[name].append(one_round(made[name], calls))
    steal = steal_share(cpu_before, cpu_times())
    load_after = os.getloadavg()
    summary: dict[str, dict[str, object]] = {}
    ratios: dict[str, float] = {}
    table = []
    for name, rounds_of in per_round.items():
        everything = [t for one in rounds_of for t in one]
        p50s = [statistics.median(one) for one in rounds_of]
        p90s = [percentile(one, 0.9) for one in rounds_of]
        worst = max(p90 / p50 for p90, p50 in zip(p90s, p50s))
        median = 1e6 * statistics.median(everything)
        summary[name] = {"median_us": median, "round_p50_us": [1e6 * v for v in p50s],
                         "round_p90_us": [1e6 * v for v in p90s], "worst_p90_over_p50": worst}
        table.append(f"  {name:32s} {median:9.1f} us   rounds p50 "
                     f"{1e6 * min(p50s):.0f}-{1e6 * max(p50s):.0f} us, worst p90/p50 {worst:.2f}")
    medians = {name: float(side["median_us"]) for name, side in summary.items()}  # type: ignore[arg-type]
    for ours, reference in PAIRS:
        if ours in medians and reference in medians:
            ratios[f"{ours} / {reference}"] = ratio = medians[ours] / medians[reference]
            table.append(f"  {ours} / {reference}: {ratio:.2f}x")
    results = {"size": comm.Get_size(), "host": platform.node(), "calls_per_round": calls, "rounds": rounds,
               "load_before": load_before, "load_after": load_after, "cpu_steal": steal, "sides": summary,
               "ratios": ratios}
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, {rounds} rounds of {calls} calls per side, load average "
              f"{load_before[0]:.2f} -> {load_after[0]:.2f}, CPU steal {percent(steal)}")
        print("\n".join(table))
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
