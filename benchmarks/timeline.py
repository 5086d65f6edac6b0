"""Benchmark: what the timeline costs the engine thread, and a training-like loop with it on.

Two measurements, each alternating its sides and reporting medians:

* ``events`` (one process): for one tensor (a cycle mark and the 11 calls of a negotiated, fused,
  executed allreduce), the calling thread's time in the timeline's event calls, wall and CPU (what
  the engine thread pays), and the process's CPU time including any writer thread and the close.
* ``steps`` (run under ``mpiexec -n 2``): steps of 32 small allreduces (1 KiB each, the engine's fused
  path), with no timeline, with this timeline and, given ``--baseline``, with another implementation
  of `Timeline` loaded from a file, every side switched on rank 0 between repetitions (as
  ``start_timeline`` does), with ``mark_cycles`` on.

``--baseline FILE`` names a Python file that defines a ``Timeline`` class with the same constructor
and methods (for example an earlier version of ``unison/engine/timeline.py``). Results go to
``benchmarks/results/timeline.json`` with the load average.

    python benchmarks/timeline.py events --baseline /tmp/timeline_old.py
    mpiexec -n 2 python benchmarks/timeline.py steps --baseline /tmp/timeline_old.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from unison.engine.timeline import Timeline

RESULTS = Path(__file__).resolve().parent / "results" / "timeline.json"
NAMES = [f"allreduce.layer{i}.weight" for i in range(50)]


def load_baseline(path: str | None) -> Any:
    """The ``Timeline`` class defined in the file `path` (None without one)."""
    if path is None:
        return None
    # Loaded as a module of unison.engine, so that a copy of unison's own file keeps its imports.
    spec = importlib.util.spec_from_file_location("unison.engine.baseline_timeline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Timeline


def one_tensor(timeline: Any, name: str) -> None:
    """The calls the engine makes for one negotiated, fused and executed allreduce."""
    timeline.mark_cycle()
    timeline.negotiate_start(name, "allreduce")
    timeline.negotiate_rank_ready(name, 0)
    timeline.negotiate_rank_ready(name, 1)
    timeline.negotiate_end(name)
    timeline.start(name, "allreduce")
    timeline.activity_start(name, "MEMCPY_IN_FUSION_BUFFER")
    timeline.activity_end(name)
    timeline.activity_start(name, "MPI_ALLREDUCE")
    timeline.activity_end(name)
    timeline.end(name, "float32", (256,))


def events_side(cls: Any, directory: str, tensors: int) -> tuple[float, float, float]:
    """Microseconds per tensor for one Timeline class: the calls' wall time and CPU time on the
    calling thread, and the whole process's CPU time (writer thread and close included)."""
    timeline = cls(os.path.join(directory, f"{cls.__module__}.json"), mark_cycles=True)
    cpu_start = time.process_time()
    thread_start = time.thread_time()
    start = time.perf_counter()
    for i in range(tensors):
        one_tensor(timeline, NAMES[i % len(NAMES)])
    calls = time.perf_counter() - start
    thread = time.thread_time() - thread_start
    timeline.close()
    cpu = time.process_time() - cpu_start
    return calls / tensors * 1e6, thread / tensors * 1e6, cpu / tensors * 1e6


def run_events(baseline: Any, tensors: int, repeats: int) -> dict[str, Any]:
    sides = {"current": Timeline, **({"baseline": baseline} if baseline is not None else {})}
    keys = ("calls_wall_us", "calls_thread_cpu_us", "process_cpu_us")
    samples: dict[str, dict[str, list[float]]] = {s: {k: [] for k in keys} for s in sides}
    with tempfile.TemporaryDirectory() as directory:
        for cls in sides.values():  # warm-up
            events_side(cls, directory, tensors // 10)
        for _ in range(repeats):
            for side, cls in sides.items():
                for key, value in zip(keys, events_side(cls, directory, tensors)):
                    samples[side][key].append(value)
    return {side: {key: statistics.median(values) for key, values in kinds.items()}
            for side, kinds in samples.items()} | {"tensors": tensors, "repeats": repeats}


def run_steps(baseline: Any, steps: int, repeats: int) -> dict[str, Any] | None:
    from mpi4py import MPI

    import unison as hvd
    from unison._job import runtime as _runtime

    hvd.init()
    comm = MPI.COMM_WORLD
    engine = _runtime.job().engine
    arrays = [np.full(256, float(hvd.rank()), np.float32) for _ in range(32)]
    directory = comm.bcast(tempfile.mkdtemp() if hvd.rank() == 0 else None, root=0)
    sides: dict[str, Any] = {"off": None, "current": Timeline}
    if baseline is not None:
        sides["baseline"] = baseline

    def step() -> None:
        handles = [hvd.allreduce_async(a, name=f"t{i}") for i, a in enumerate(arrays)]
        for h in handles:
            hvd.synchronize(h)

    def timed(cls: Any) -> float:
        if hvd.rank() == 0 and cls is not None:
            engine.set_timeline(cls(os.path.join(directory, "steps.json"), mark_cycles=True))
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - start
        comm.Barrier()
        if hvd.rank() == 0:
            engine.set_timeline(None)
        return float(comm.allreduce(seconds, op=MPI.MAX))

    for cls in sides.values():  # warm-up: negotiation, cache, fusion buffer
        timed(cls)
    samples: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(repeats):
        for side, cls in sides.items():
            samples[side].append(timed(cls) / steps * 1e6)
    hvd.shutdown()
    if comm.Get_rank() != 0:
        return None
    return {side: statistics.median(values) for side, values in samples.items()} | {
        "steps": steps, "repeats": repeats, "ranks": comm.Get_size(), "unit": "us per step"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["events", "steps"])
    parser.add_argument("--baseline", help="a file defining another Timeline class to compare with")
    parser.add_argument("--tensors", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="a short self-check (not a measurement)")
    args = parser.parse_args()
    if args.quick:
        args.tensors, args.steps, args.repeats = 200, 5, 1
    baseline = load_baseline(args.baseline)
    load_before = os.getloadavg()
    if args.what == "events":
        result: dict[str, Any] | None = run_events(baseline, args.tensors, args.repeats)
    else:
        result = run_steps(baseline, args.steps, args.repeats)
    if result is None or args.quick:
        if result is not None:
            print(json.dumps(result, indent=2))
        return
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    result["cpus"] = os.cpu_count()
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored[args.what] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
