"""One process's CPU per call in the steady state: what a recurring small collective costs the rank that makes it.

Run: ``mpiexec -n 2 python benchmarks/call_cpu.py [--calls 20000] [--rounds 5] [--output PATH]``

Each round makes `--calls` calls in a row of each side (sides alternate between rounds) and reads the
process's CPU time (user + system, `time.process_time`) around them; a call's CPU is the round's CPU
over its calls. Sides: ``hvd.allreduce`` of 4 KiB (named: its response is cached, it runs its cycle on
the calling thread) and ``dist.all_reduce`` of 4 KiB on the ``unison`` backend. Both ranks measure;
rank 0 reports each side's median round, its own and rank 1's, with the load average before and after,
and writes ``benchmarks/results/call_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI

import unison as hvd

KiB = 1024


def sides(with_torch: bool) -> dict[str, Callable[[], object]]:
    x = np.ones(KiB, dtype=np.float32)
    made: dict[str, Callable[[], object]] = {"hvd.allreduce 4 KiB": lambda: hvd.allreduce(x, name="cpu.4k", op=hvd.Sum)}
    if with_torch:
        import torch
        import torch.distributed as dist

        import unison.torch  # noqa: F401 - registers the unison backend

        if not dist.is_initialized():
            dist.init_process_group("unison")
        tensor = torch.ones(KiB)
        made["dist.all_reduce 4 KiB unison"] = lambda: dist.all_reduce(tensor)
    return made


def one_round(call: Callable[[], object], calls: int) -> float:
    """Microseconds of this process's CPU per call over `calls` calls in a row."""
    start = time.process_time()
    for _ in range(calls):
        call()
    return 1e6 * (time.process_time() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "call_cpu.json"))
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    made = sides(not args.no_torch)
    load_before = os.getloadavg()
    for call in made.values():
        one_round(call, 200)
    rounds: dict[str, list[float]] = {name: [] for name in made}
    for index in range(args.rounds):
        for name in (list(made) if index % 2 == 0 else list(reversed(made))):
            comm.Barrier()
            rounds[name].append(one_round(made[name], args.calls))
    gathered = comm.gather(rounds, root=0)
    if comm.Get_rank() == 0:
        assert gathered is not None
        summary = {name: {f"rank {rank}": statistics.median(per_rank[name]) for rank, per_rank in enumerate(gathered)}
                   for name in made}
        results = {"calls_per_round": args.calls, "rounds": args.rounds, "load_before": load_before,
                   "load_after": os.getloadavg(), "cpu_us_per_call": summary, "rounds_us": gathered}
        print(f"load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
        for name, per_rank in summary.items():
            print(f"  {name:32s} " + "  ".join(f"{who} {value:6.2f} us" for who, value in per_rank.items()))
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
