"""Benchmark: the GPU data plane's device fusion and its per-step cost, on one GPU.

Run ``python benchmarks/gpu.py`` on a machine with a GPU and CuPy (``pip install -e '.[gpu-cuda12]'``).
Two measurements, each the median of timed repetitions bracketed by CUDA events on unison's stream:

1. fusion: packing the 161 ResNet-50 gradients (25.6 M float32) into the fusion buffer and unpacking
   them, in GB/s of bytes moved, against one device-to-device copy of the same bytes;
2. per-step cost: one training step's gradient reduction on a single rank (the fused allreduce
   responses a 64 MiB fusion threshold makes of the same set, Average, over NCCL) in ms, which is the
   data plane's overhead on one GPU, where the reduction itself moves nothing.

Without CuPy or a visible GPU it prints why and exits with status 0. Results go to
``benchmarks/results/gpu.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def why_no_gpu() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install -e '.[gpu-cuda12]' or '.[gpu-cuda13]')"
    try:
        import cupy

        if int(cupy.cuda.runtime.getDeviceCount()) == 0:
            return "no GPU is visible"
    except Exception as exc:  # noqa: BLE001 - any CUDA failure means there is nothing to measure
        return f"no usable GPU ({type(exc).__name__}: {exc})"
    return ""


def resnet50_counts() -> list[int]:
    """Element counts of ResNet-50's 161 parameter tensors (25.6 M), in definition order."""
    counts = [64 * 3 * 7 * 7, 64, 64]
    in_ch = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_ch = width * 4
            counts += [width * in_ch, width, width, width * width * 9, width, width, out_ch * width, out_ch, out_ch]
            if block == 0:
                counts += [out_ch * in_ch, out_ch, out_ch]
            in_ch = out_ch
    return counts + [1000 * 2048, 1000]


def timed(fn: Any, stream: Any, repeats: int) -> list[float]:
    import cupy

    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    reason = why_no_gpu()
    if reason:
        print(f"benchmarks/gpu.py: skipped: {reason}")
        return 0
    import cupy

    from unison.backends.loopback import LoopbackBackend
    from unison.dtypes import DType
    from unison.engine.executor import Entry, Handle
    from unison.gpu import handoff
    from unison.gpu.cupy_device import CupyLibrary
    from unison.gpu.ordering import mark_ready
    from unison.gpu.plane import GpuPlane
    from unison.ops import CollectiveKind, ReduceOp
    from unison.protocol.messages import Request, Response, ResponseKind

    device = handoff.device_for(0)
    stream = device.stream()
    counts = resnet50_counts()
    with stream:
        grads = [cupy.random.standard_normal(c, dtype=cupy.float32) for c in counts]
        outs = [cupy.empty_like(g) for g in grads]
        flat = cupy.empty(sum(counts), dtype=cupy.float32)
        copy_dst = cupy.empty_like(flat)
    nbytes = sum(counts) * 4

    def fusion() -> None:
        device.pack(flat, grads, counts, 1.0, DType.FLOAT32, stream)
        device.unpack(flat, outs, counts, stream)

    def plain_copy() -> None:
        device.copy_(copy_dst, flat, stream)

    timed(fusion, stream, 3)
    fuse_s = statistics.median(timed(fusion, stream, args.repeats))
    copy_s = statistics.median(timed(plain_copy, stream, args.repeats))

    plane = GpuPlane(LoopbackBackend(), 0, {0: (0,)}, device, CupyLibrary())
    threshold = 64 << 20
    groups: list[list[int]] = [[]]
    for index, count in enumerate(counts):
        if groups[-1] and (sum(counts[i] for i in groups[-1]) + count) * 4 > threshold:
            groups.append([])
        groups[-1].append(index)

    def step() -> None:
        for group in groups:
            names = tuple(f"g{i}" for i in group)
            response = Response(ResponseKind.ALLREDUCE, names, DType.FLOAT32, tuple((counts[i],) for i in group),
                                ReduceOp.AVERAGE, device="cuda")
            entries = []
            for i in group:
                buffer = mark_ready(device, grads[i])
                request = Request(f"g{i}", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (counts[i],),
                                  ReduceOp.AVERAGE, device="cuda")
                entries.append(Entry(request, buffer, buffer, Handle(f"g{i}")))  # type: ignore[arg-type]
            plane.run(response, entries)

    timed(step, stream, 3)
    step_s = statistics.median(timed(step, stream, args.repeats))
    result = {"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "tensors": len(counts),
              "bytes": nbytes, "fusion_pack_unpack_gbps": 2 * nbytes / fuse_s / 1e9,
              "device_copy_gbps": nbytes / copy_s / 1e9, "step_ms": step_s * 1e3, "responses_per_step": len(groups)}
    print(f"GPU: {result['gpu']}; {len(counts)} tensors, {nbytes / 1e6:.1f} MB")
    print(f"fusion pack+unpack {result['fusion_pack_unpack_gbps']:.1f} GB/s, "
          f"device-to-device copy {result['device_copy_gbps']:.1f} GB/s")
    print(f"per-step gradient reduction on one GPU: {result['step_ms']:.2f} ms in {len(groups)} responses")
    out = ROOT / "benchmarks" / "results" / "gpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
