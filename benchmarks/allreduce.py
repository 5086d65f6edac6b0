"""Benchmark: unison's blocking allreduce against raw mpi4py on the same buffers, side by side.

Run under ``mpiexec -n 2 python benchmarks/allreduce.py``. Every case alternates the two sides
(raw, unison, raw, unison, ...) with a barrier before each timed call, and reports medians, so that
machine noise hits both sides alike. Results go to ``benchmarks/results/allreduce.json`` with the
load average, and a table is printed on rank 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import unison as hvd

KiB, MiB = 1024, 1024 * 1024


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The 161 parameter tensors of ResNet-50 (25.6 M floats), in definition order."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    in_ch = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_ch = width * 4
            shapes += [(width, in_ch, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out_ch, width, 1, 1), (out_ch,), (out_ch,)]
            if block == 0:
                shapes += [(out_ch, in_ch, 1, 1), (out_ch,), (out_ch,)]
            in_ch = out_ch
    shapes += [(1000, 2048), (1000,)]
    return shapes


def timed(comm: MPI.Comm, fn) -> float:  # type: ignore[no-untyped-def]
    comm.Barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(comm: MPI.Comm, sides: dict, repeats: int) -> dict[str, float]:  # type: ignore[type-arg]
    """Alternate the sides `repeats` times; return each side's median seconds (max over ranks)."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():  # warm-up: first call negotiates, allocates, fills caches
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            samples[name].append(timed(comm, fn))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {name: comm.allreduce(value, op=MPI.MAX) for name, value in medians.items()}


def repeats_for(nbytes: int, quick: bool) -> int:
    base = 200 if nbytes <= 64 * KiB else 40 if nbytes <= 4 * MiB else 10 if nbytes <= 64 * MiB else 5
    return max(3, base // 4) if quick else base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "allreduce.json"))
    args = parser.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    load_before = os.getloadavg()
    results: dict[str, object] = {"size": size, "host": platform.node(), "load_before": load_before,
                                  "mpi": MPI.Get_library_version().splitlines()[0].strip(), "cases": []}
    cases: list[dict[str, object]] = results["cases"]  # type: ignore[assignment]

    sizes = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    if args.quick:
        sizes = [4 * KiB, 1 * MiB, 64 * MiB]
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        raw_out = np.empty_like(x)
        uni_out = np.empty_like(x)
        name = f"bench.{nbytes}"
        med = side_by_side(comm, {
            "raw": lambda x=x, out=raw_out: comm.Allreduce(x, out, op=MPI.SUM),
            "unison": lambda out=uni_out, name=name: hvd.allreduce_(out, op=hvd.Sum, name=name),
        }, repeats_for(nbytes, args.quick))
        cases.append({"case": "allreduce", "bytes": nbytes, **med})

    # 161 tensors of ResNet-50 shapes, one step: unison gets them all at once (as an optimizer
    # would submit them); the raw side reduces one buffer that is already fused.
    shapes = resnet50_shapes()
    grads = [np.ones(s, np.float32) for s in shapes]
    total = sum(g.size for g in grads)
    fused = np.ones(total, np.float32)
    fused_out = np.empty_like(fused)

    def unison_step() -> None:
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"resnet.{i}") for i, g in enumerate(grads)]
        for handle in handles:
            hvd.synchronize(handle)

    med = side_by_side(comm, {
        "raw": lambda: comm.Allreduce(fused, fused_out, op=MPI.SUM),
        "unison": unison_step,
    }, 5 if args.quick else 15)
    cases.append({"case": "resnet50_step", "tensors": len(shapes), "bytes": total * 4, **med})

    # Fusion policy sweep on the same step: which tensors are worth copying into the fusion buffer.
    from unison.protocol.fusion import FusionPolicy

    engine = hvd._job.runtime.job().engine
    default_policy = engine.policy
    policies = {"no_fusion": FusionPolicy(threshold_bytes=0)}
    for limit in (64 * KiB, 1 * MiB, 16 * MiB, 128 * MiB):
        policies[f"fuse_up_to_{limit // KiB}KiB"] = FusionPolicy(max_tensor_bytes=limit)
    policy_sides = {}
    for label, policy in policies.items():
        def run_policy(policy: FusionPolicy = policy) -> None:
            engine.policy = policy
            unison_step()
        policy_sides[label] = run_policy
    med = side_by_side(comm, policy_sides, 3 if args.quick else 8)
    engine.policy = default_policy
    cases.append({"case": "fusion_policy_resnet50", **med})

    # Chunk-size sweep on 64 MiB: the policy behind UNISON_CHUNK_BYTES.
    backend: Any = hvd._job.runtime.job().engine.backend  # the MPI backend: its chunk size is swept
    default_chunk = backend.chunk_bytes
    x = np.ones(64 * MiB // 4, np.float32)
    chunk_sides = {}
    for chunk in (0, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB):
        def run(chunk: int = chunk) -> None:
            backend.chunk_bytes = chunk
            hvd.allreduce_(x, op=hvd.Sum, name="sweep")
        chunk_sides[str(chunk)] = run
    sweep = side_by_side(comm, chunk_sides, 3 if args.quick else 10)
    backend.chunk_bytes = default_chunk
    cases.append({"case": "chunk_sweep_64MiB", **{f"chunk_{k}": v for k, v in sweep.items()}})

    # Idle engine: initialized, no work, for a few seconds; CPU time of the whole process.
    idle_seconds = 2.0 if args.quick else 5.0
    comm.Barrier()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(idle_seconds)
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    idle = comm.gather(cpu, root=0)
    cases.append({"case": "idle_cpu_share", "per_rank": idle})

    results["load_after"] = os.getloadavg()
    stats = dataclasses.asdict(hvd.statistics())
    results["engine_statistics_rank0"] = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
    hvd.shutdown()
    if rank == 0:
        report(results)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {out}")


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.2f} ms"


def report(results: dict) -> None:  # type: ignore[type-arg]
    print(f"unison allreduce vs raw mpi4py, {results['size']} ranks, {results['mpi']}")
    print(f"load average before: {results['load_before']}, after: {results['load_after']}")
    print(f"{'case':<24}{'raw mpi4py':>14}{'unison':>14}{'unison/raw':>12}")
    for case in results["cases"]:
        if case["case"] == "allreduce":
            label = f"allreduce {case['bytes'] // 1024} KiB"
        elif case["case"] == "resnet50_step":
            label = f"resnet50 step ({case['tensors']} t)"
        else:
            continue
        print(f"{label:<24}{fmt_time(case['raw']):>14}{fmt_time(case['unison']):>14}"
              f"{case['unison'] / case['raw']:>11.2f}x")
    for case in results["cases"]:
        if case["case"] == "chunk_sweep_64MiB":
            print("64 MiB allreduce by chunk size: " + ", ".join(
                f"{'none' if k == 'chunk_0' else str(int(k[6:]) // 1024 // 1024) + ' MiB'}: {fmt_time(v).strip()}"
                for k, v in case.items() if k.startswith("chunk_")))
        if case["case"] == "fusion_policy_resnet50":
            print("resnet50 step by fusion policy: " + ", ".join(
                f"{k}: {fmt_time(v).strip()}" for k, v in case.items() if k != "case"))
        if case["case"] == "idle_cpu_share":
            print("idle engine CPU, share of one core per rank: " + ", ".join(
                f"{100 * v:.2f}%" for v in case["per_rank"]))


if __name__ == "__main__":
    main()
