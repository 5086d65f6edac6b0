"""Allreduce across emulated hosts with capped links: unison vs raw mpi4py, flat vs hierarchical, training.

Run as root (it creates network namespaces; see docs/multihost.md):

    python benchmarks/multihost.py [--rates 1000,10000] [--sizes-mib 1,16] [--train] [--compression]

For each link rate (Mbit/s, a tbf cap on both ends of every link): 2 emulated hosts x 1 slot, the
median time of an allreduce of float32 buffers with raw mpi4py (``Allreduce`` in place, one call) and
with ``unison.allreduce`` (negotiation, 4 MiB chunks), as algorithm bandwidth (bytes x 8 / time).
Then 2 hosts x 2 slots: unison's flat allreduce against ``UNISON_HIERARCHICAL_ALLREDUCE=1``. With
``--train``, benchmarks/train_torch.py (2 hosts x 1 slot) at each rate; with ``--compression``,
benchmarks/compression.py likewise (each scheme's step time on the real link); their JSON goes to
``benchmarks/results/multihost_*.json``, beside (not over) the local results. Load averages are printed:
on a shared machine, compare numbers only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MiB = 1024 * 1024


def rank_main(sizes_mib: list[float], repeats: int) -> None:
    """One rank: time raw mpi4py and unison allreduce; rank 0 prints one ROW line per size."""
    from mpi4py import MPI

    import unison as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    for size_mib in sizes_mib:
        buf = np.ones(int(size_mib * MiB) // 4, dtype=np.float32)
        times: dict[str, list[float]] = {"mpi4py": [], "unison": []}
        for attempt in range(repeats + 1):
            for mode in times:
                comm.Barrier()
                start = time.perf_counter()
                if mode == "mpi4py":
                    comm.Allreduce(MPI.IN_PLACE, buf)
                else:
                    hvd.allreduce_(buf, op=hvd.Sum, name=f"b{size_mib}")
                elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                if attempt:  # the first round warms up connections and buffers
                    times[mode].append(elapsed)
        if hvd.rank() == 0:
            row = {"size_mib": size_mib, **{m: statistics.median(t) for m, t in times.items()}}
            print("ROW " + json.dumps(row), flush=True)
    hvd.shutdown()


def rows_of(stdout: str) -> list[dict[str, float]]:
    return [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW ")]


def gbit(size_mib: float, seconds: float) -> float:
    return size_mib * MiB * 8 / seconds / 1e9


def job(cluster: object, args: list[str], env: dict[str, str] | None = None) -> str:
    done = cluster.run([sys.executable, str(HERE), *args], env=env, timeout=600)  # type: ignore[attr-defined]
    if done.returncode != 0:
        sys.exit(f"job failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return str(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,10000", help="link caps in Mbit/s")
    parser.add_argument("--sizes-mib", default="1,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train", action="store_true", help="also run benchmarks/train_torch.py")
    parser.add_argument("--train-args", default="--steps 10")
    parser.add_argument("--compression", action="store_true",
                        help="also run benchmarks/compression.py (every scheme's step time) at each rate")
    parser.add_argument("--compression-args", default="--rounds 2 --steps 3 --no-digits")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    if args.rank:
        rank_main(sizes, args.repeats)
        return
    from unison.testing.hosts import EmulatedHosts, unavailable_reason

    reason = unavailable_reason()
    if reason:
        sys.exit(f"benchmarks/multihost.py: {reason}")
    rank_args = ["--rank", "--sizes-mib", args.sizes_mib, "--repeats", str(args.repeats)]
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} (1/5/15 min), {os.cpu_count()} cores")
    print("\n2 hosts x 1 slot: allreduce, float32, median; algbw = bytes x 8 / time")
    print(f"{'link':>8} {'size':>8} {'mpi4py ms':>10} {'unison ms':>10} {'mpi4py Gb/s':>12} {'unison Gb/s':>12}")
    for rate in [float(r) for r in args.rates.split(",")]:
        with EmulatedHosts(hosts=2, slots=1, rate_mbit=rate) as cluster:
            for row in rows_of(job(cluster, rank_args)):
                s = row["size_mib"]
                print(f"{rate / 1000:>5g} Gb {s:>5g} MiB {row['mpi4py'] * 1e3:>10.1f} {row['unison'] * 1e3:>10.1f} "
                      f"{gbit(s, row['mpi4py']):>12.2f} {gbit(s, row['unison']):>12.2f}", flush=True)
    rate = float(args.rates.split(",")[0])
    print(f"\n2 hosts x 2 slots, {rate / 1000:g} Gbit/s links: unison flat vs hierarchical allreduce (median ms)")
    print("(MPICH's own allreduce is already node-aware unless MPIR_CVAR_ENABLE_SMP_COLLECTIVES=0; the last "
          "two columns turn that off)")
    print(f"{'size':>8} {'mpi4py':>8} {'flat':>8} {'hierarchical':>13} {'flat,smp=0':>11} {'hier.,smp=0':>12}")
    no_smp = {"MPIR_CVAR_ENABLE_SMP_COLLECTIVES": "0"}
    with EmulatedHosts(hosts=2, slots=2, rate_mbit=rate) as cluster:
        runs = [rows_of(job(cluster, rank_args, env={**extra, "UNISON_HIERARCHICAL_ALLREDUCE": hier}))
                for extra in ({}, no_smp) for hier in ("0", "1")]
    for f, h, f0, h0 in zip(*runs):
        print(f"{f['size_mib']:>4g} MiB {f['mpi4py'] * 1e3:>8.1f} {f['unison'] * 1e3:>8.1f} "
              f"{h['unison'] * 1e3:>13.1f} {f0['unison'] * 1e3:>11.1f} {h0['unison'] * 1e3:>12.1f}", flush=True)
    if args.train:
        train = HERE.with_name("train_torch.py")
        for rate in [float(r) for r in args.rates.split(",")]:
            print(f"\ntrain_torch.py, 2 hosts x 1 slot, {rate / 1000:g} Gbit/s links:", flush=True)
            with EmulatedHosts(hosts=2, slots=1, rate_mbit=rate) as cluster:
                env = {"MASTER_ADDR": cluster.addresses[0], "GLOO_SOCKET_IFNAME": "eth0"}
                output = HERE.parent / "results" / f"multihost_train_torch_{rate / 1000:g}gbit.json"
                done = cluster.run([sys.executable, str(train), *args.train_args.split(), "--output", str(output)],
                                   env=env, timeout=600)
            print(done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr[-1500:]}", flush=True)
    if args.compression:
        script = HERE.with_name("compression.py")
        for rate in [float(r) for r in args.rates.split(",")]:
            print(f"\ncompression.py, 2 hosts x 1 slot, {rate / 1000:g} Gbit/s links:", flush=True)
            with EmulatedHosts(hosts=2, slots=1, rate_mbit=rate) as cluster:
                output = HERE.parent / "results" / f"multihost_compression_{rate / 1000:g}gbit.json"
                done = cluster.run([sys.executable, str(script), *args.compression_args.split(), "--output",
                                    str(output)], timeout=900)
            print(done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr[-1500:]}", flush=True)
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")


if __name__ == "__main__":
    main()
