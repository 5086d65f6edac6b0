"""Small collectives back to back: what one call costs, side by side with the transport it runs on.

Run: ``mpiexec -n 2 python benchmarks/latency.py [--calls 300] [--rounds 8] [--no-bind] [--quick] [--output PATH]``

Each side makes `--calls` calls in a row with no barrier between them (the calls of a training step,
a metric in a loop), and a round times them one by one; the sides take turns round by round, so that a
busy spell of the machine hits every side alike. Sides: raw mpi4py ``Allreduce`` and unison's
``hvd.allreduce`` (named, so its response is cached: the steady state) at 4 KiB and 64 KiB, and
``dist.all_reduce`` of 4 KiB on the ``unison`` backend and on ``gloo``; and two calls that rank 0
negotiates every time (only an allreduce's response is cached): ``hvd.broadcast_`` of 4 KiB against
mpi4py's ``Bcast``, ``hvd.barrier`` against its ``Barrier``. Reported per side: the median
call over all rounds, each round's median (p50) and 90th percentile (p90), and the worst round's
p90/p50 (a call that switches between a fast and a slow mode shows there); per pair, the ratio of the
medians. The load average before and after is recorded. Rank 0 writes
``benchmarks/results/latency.json``.

Each rank pins itself to a core of its own before anything starts a thread (``--no-bind``: the OS
places them). With as many busy ranks as cores, Linux sometimes runs two ranks on one core for a while,
most often right after a spell of sleeping waits (gloo's calls), and every call of such a round runs
3-4x slower, raw MPI's included (seen: a round of mpi4py 4 KiB calls at 14.6 us against 3.7-4.6 us in
the rounds around it). Every round records which core each rank ran on, sampled between calls, and the
report counts the rounds in which two ranks of a host shared one core; the worst p90/p50 is also given
over the rounds in which they did not.

The control side times a Python loop of about the steady call's own CPU time, with no communication,
in the same alternation: its rounds' p90/p50 is the machine's own spread. A virtual machine's core
runs at two speeds in turn (seen on the 2-core machine, one process alone on a bound core: a quarter
of the time at half speed, in spells of about 1 ms and up to 45 ms), so a round of 300 calls that
straddles a change of speed has a p90 well above its p50 whatever the call.
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
from machine import bind_to_core, cpu_times, current_core, percent, shared_a_core, steal_share
from mpi4py import MPI

import unison as hvd

KiB = 1024
PAIRS = (("hvd.allreduce 4 KiB", "mpi4py Allreduce 4 KiB"), ("hvd.allreduce 64 KiB", "mpi4py Allreduce 64 KiB"),
         ("dist.all_reduce 4 KiB unison", "dist.all_reduce 4 KiB gloo"),
         ("hvd.broadcast 4 KiB", "mpi4py Bcast 4 KiB"), ("hvd.barrier", "mpi4py Barrier"))


CONTROL = "Python loop, no communication"


def python_loop(steps: int = 800) -> int:
    """About 10 us of the interpreter's own work on the 2-core machine, and nothing else: the control side."""
    total = 0
    for step in range(steps):
        total += step
    return total


def sides(comm: MPI.Comm, with_torch: bool) -> dict[str, Callable[[], object]]:
    """One call of each side, on buffers made once; the control side first."""
    made: dict[str, Callable[[], object]] = {CONTROL: python_loop}
    for nbytes in (4 * KiB, 64 * KiB):
        label = f"{nbytes // KiB} KiB"
        x = np.ones(nbytes // 4, dtype=np.float32)
        y = np.empty_like(x)
        made[f"mpi4py Allreduce {label}"] = functools.partial(comm.Allreduce, x, y)
        made[f"hvd.allreduce {label}"] = functools.partial(hvd.allreduce, x, name=f"latency.{nbytes}", op=hvd.Sum)
    # Negotiated calls: only an allreduce's response is cached, so each of these asks rank 0 (the slow path).
    b = np.ones(KiB, dtype=np.float32)
    made["mpi4py Bcast 4 KiB"] = functools.partial(comm.Bcast, b, root=0)
    made["hvd.broadcast 4 KiB"] = functools.partial(hvd.broadcast_, b, 0, name="latency.broadcast")
    made["mpi4py Barrier"] = comm.Barrier
    made["hvd.barrier"] = hvd.barrier
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


SAMPLE_EVERY = 50  # calls between two readings of the core a rank runs on (taken outside the timing)


def one_round(call: Callable[[], object], calls: int, cores: list[int | None] | None = None) -> list[float]:
    """Seconds of each of `calls` calls in a row; the rank's core every SAMPLE_EVERY calls into `cores`."""
    times = []
    clock = time.perf_counter
    for index in range(calls):
        if cores is not None and index % SAMPLE_EVERY == 0:
            cores.append(current_core())
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
    parser.add_argument("--no-bind", action="store_true", help="leave the ranks' placement on cores to the OS")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 100 calls (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "latency.json"))
    args = parser.parse_args()
    calls, rounds = (100, 3) if args.quick else (args.calls, args.rounds)

    host = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    core = None if args.no_bind else bind_to_core(host.Get_rank())  # before unison and torch start threads
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    made = sides(comm, not args.no_torch)
    load_before, cpu_before = os.getloadavg(), cpu_times()
    for call in made.values():  # warm-up: negotiate once, fill caches, make the groups' buffers
        one_round(call, 20)
    per_round: dict[str, list[list[float]]] = {name: [] for name in made}
    cores_seen: dict[str, list[list[int | None]]] = {name: [] for name in made}
    for index in range(rounds):
        order = list(made) if index % 2 == 0 else list(reversed(made))
        for name in order:
            comm.Barrier()
            cores_seen[name].append([])
            per_round[name].append(one_round(made[name], calls, cores_seen[name][-1]))
    on_host = host.gather(cores_seen)  # this host's ranks' cores, round by round
    bound = comm.gather(core) or []
    steal = steal_share(cpu_before, cpu_times())
    load_after = os.getloadavg()
    summary: dict[str, dict[str, object]] = {}
    ratios: dict[str, float] = {}
    table = []
    for name, rounds_of in per_round.items():
        everything = [t for one in rounds_of for t in one]
        p50s = [statistics.median(one) for one in rounds_of]
        p90s = [percentile(one, 0.9) for one in rounds_of]
        spreads = [p90 / p50 for p90, p50 in zip(p90s, p50s)]
        shared = ([shared_a_core([ranks[name][r] for ranks in on_host]) for r in range(rounds)]
                  if on_host is not None else [False] * rounds)
        apart = [spread for spread, together in zip(spreads, shared) if not together]
        worst, worst_apart = max(spreads), max(apart, default=None)
        median = 1e6 * statistics.median(everything)
        summary[name] = {"median_us": median, "round_p50_us": [1e6 * v for v in p50s],
                         "round_p90_us": [1e6 * v for v in p90s], "worst_p90_over_p50": worst,
                         "rounds_sharing_a_core": sum(shared), "worst_p90_over_p50_apart": worst_apart}
        apart_text = "" if not any(shared) else (
            f"; {sum(shared)} round(s) with two ranks on one core, worst apart "
            + ("-" if worst_apart is None else f"{worst_apart:.2f}"))
        table.append(f"  {name:32s} {median:9.1f} us   rounds p50 "
                     f"{1e6 * min(p50s):.0f}-{1e6 * max(p50s):.0f} us, worst p90/p50 {worst:.2f}{apart_text}")
    medians = {name: float(side["median_us"]) for name, side in summary.items()}  # type: ignore[arg-type]
    for ours, reference in PAIRS:
        if ours in medians and reference in medians:
            ratios[f"{ours} / {reference}"] = ratio = medians[ours] / medians[reference]
            table.append(f"  {ours} / {reference}: {ratio:.2f}x")
    results = {"size": comm.Get_size(), "host": platform.node(), "calls_per_round": calls, "rounds": rounds,
               "load_before": load_before, "load_after": load_after, "cpu_steal": steal,
               "bound_to_cores": bound, "sides": summary, "ratios": ratios}
    if comm.Get_rank() == 0:
        placed = "ranks bound to cores " + ", ".join(map(str, bound)) if None not in bound else "placed by the OS"
        print(f"{comm.Get_size()} ranks ({placed}), {rounds} rounds of {calls} calls per side, load average "
              f"{load_before[0]:.2f} -> {load_after[0]:.2f}, CPU steal {percent(steal)}")
        print("\n".join(table))
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
