"""Benchmark: the Python cost of the GPU route per step, on a fake device (no GPU needed).

A step submits `--tensors` small tensors with ``allreduce_async`` and synchronizes them, at one rank,
as a DistributedOptimizer's hooks do. The GPU route's tensors are NumPy arrays marked with
``__cuda_array_interface__`` (a stand-in ``cupy`` module makes unison take its GPU route end to end:
wrapping, ready events, negotiation with ``device="cuda"``, the GPU plane on a `FakeDevice`, CUDA-aware
MPI wire, the results' stream rule); the host route's are plain NumPy arrays. The two alternate step by
step and the medians are compared: on a GPU the device's own work runs asynchronously, so this ratio is
the part of the route's cost that is Python, the part a training step waits for on the host.

Run ``python benchmarks/gpu_route.py``; results go to ``benchmarks/results/gpu_route.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class GpuArray(np.ndarray):
    """A NumPy array that says it lives on a GPU."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ctypes.data, False), "version": 3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=161, help="tensors per step (ResNet-50 has 161)")
    parser.add_argument("--elements", type=int, default=16, help="elements per tensor (small: the cost is per tensor)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per route")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "gpu_route.json"))
    args = parser.parse_args()

    stand_in = types.ModuleType("cupy")
    stand_in.ndarray = np.ndarray  # type: ignore[attr-defined]
    stand_in.ascontiguousarray = np.ascontiguousarray  # type: ignore[attr-defined]
    stand_in.empty_like = np.empty_like  # type: ignore[attr-defined]
    sys.modules["cupy"] = stand_in
    os.environ["UNISON_GPU_OPERATIONS"] = "mpi"
    import unison as hvd
    from unison.gpu import build, handoff
    from unison.gpu.fake import FakeDevice

    build.cuda_aware_mpi = lambda mpi, load_library=None: True  # type: ignore[assignment]  # host memory here
    load_before = os.getloadavg()
    hvd.init()
    try:
        handoff.device_for(0, make=lambda ordinal: FakeDevice(ordinal))
        arrays: dict[str, list[np.ndarray]] = {"host": [np.ones(args.elements, np.float32) for _ in range(args.tensors)],
                  "gpu": [np.ones(args.elements, np.float32).view(GpuArray) for _ in range(args.tensors)]}

        def step(route: str) -> float:
            start = time.perf_counter()
            handles = [hvd.allreduce_async(a, name=f"{route}.{i}") for i, a in enumerate(arrays[route])]
            for handle in handles:
                hvd.synchronize(handle)
            return time.perf_counter() - start

        for _ in range(10):  # negotiation, then the response cache
            step("host")
            step("gpu")
        times: dict[str, list[float]] = {"host": [], "gpu": []}
        for i in range(args.steps):
            for route in ("host", "gpu") if i % 2 == 0 else ("gpu", "host"):
                times[route].append(step(route))
        from unison._job.runtime import job

        plane = job().engine.executor.device_plane.statistics()
    finally:
        hvd.shutdown()
    host, gpu = statistics.median(times["host"]), statistics.median(times["gpu"])
    result = {"tensors": args.tensors, "elements": args.elements, "steps": args.steps,
              "host_step_ms": host * 1e3, "gpu_step_ms": gpu * 1e3, "gpu_over_host": gpu / host,
              "gpu_extra_us_per_tensor": (gpu - host) / args.tensors * 1e6,
              "plane_mpi_direct_responses": plane["mpi_direct_responses"],
              "load_before": load_before, "load_after": os.getloadavg()}
    print(f"{args.tensors} tensors per step at 1 rank: host route {result['host_step_ms']:.2f} ms, GPU route "
          f"(fake device) {result['gpu_step_ms']:.2f} ms, {result['gpu_over_host']:.2f}x, "
          f"{result['gpu_extra_us_per_tensor']:.1f} us more per tensor")
    print(f"load average before: {load_before}, after: {result['load_after']}")
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
