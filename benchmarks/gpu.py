"""Benchmark: the GPU data plane's device fusion, its per-step cost, DistributedOptimizer's overhead and
the latency of a small GPU allreduce, on one GPU.

Run ``python benchmarks/gpu.py`` on a machine with a GPU, CuPy and a CUDA build of PyTorch. Four
measurements, medians of timed repetitions:

1. fusion: packing the 161 ResNet-50 gradients (25.6 M float32) into the fusion buffer and unpacking
   them, in GB/s of bytes moved, against one device-to-device copy of the same bytes (CUDA events on
   unison's stream); with the batched copy kernel (the default) and with one ``cudaMemcpyAsync`` per
   tensor, alternated. Timed twice: as the host issues it (the GPU waits for the host's planning, as
   it does in training whenever the host is not ahead), and on the device alone (the host issues
   everything while a spinning kernel holds the stream, so the events time only the GPU's work);
2. per-step cost: one training step's gradient reduction on a single rank (the fused allreduce
   responses a 64 MiB fusion threshold makes of the same set, Average, over NCCL) in ms, which is the
   data plane's overhead on one GPU, where the reduction itself moves nothing;
3. DistributedOptimizer's overhead: a ResNet-50 training step (torchvision's model, SGD with momentum,
   synthetic images) with ``hvd.DistributedOptimizer`` against the plain optimizer, at one rank,
   alternating the two in rounds, each step timed to ``torch.cuda.synchronize()``;
4. latency: ``hvd.allreduce`` of a 4 KiB CUDA tensor at one rank (negotiation, submission, the plane
   and the stream handoff), beside the same for a 4 KiB CPU tensor, and the plane's own share (one
   4 KiB response run directly, to the end of its GPU work).

``--device cpu`` runs 3 and 4 on the CPU with a small model, to check the benchmark itself where there
is no GPU (nothing is written). Without CuPy or a visible GPU the default run prints why and exits
with status 0. Results go to ``benchmarks/results/gpu.json``.
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


SPIN = r"""
extern "C" __global__ void unison_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def timed(fn: Any, stream: Any, repeats: int, *, device_only: bool = False) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, by CUDA events on `stream`.

    With `device_only`, a kernel first spins about 3 ms on `stream`, so the host has issued all of
    `fn`'s work before the start event is reached: the events then time the GPU's work alone.
    """
    import cupy
    import numpy as np

    hold = None
    if device_only:
        spin = cupy.RawKernel(SPIN, "unison_spin")
        cycles = np.int64(int(cupy.cuda.runtime.getDeviceProperties(0)["clockRate"]) * 3)  # kHz * 3 ms

        def hold() -> None:
            with stream:
                spin((1,), (1,), (cycles,))

    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        if hold is not None:
            hold()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1000)
    return times


def training_model(device: str, small: bool) -> tuple[Any, Any, str]:
    """(model, a batch of inputs, what it is): torchvision's ResNet-50, or a small stand-in."""
    import torch

    if not small:
        try:
            import torchvision

            model = torchvision.models.resnet50()
            return model.to(device), torch.randn(64, 3, 224, 224, device=device), "ResNet-50, batch 64 at 224x224"
        except ImportError:
            pass
    layers: list[Any] = []
    for _ in range(80):  # 160 parameter tensors, about as many as ResNet-50's 161
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    return model, torch.randn(32, 256, device=device), "80 Linear(256, 256) layers, batch 32"


def optimizer_overhead(device: str, small: bool, rounds: int, steps: int) -> dict[str, Any]:
    """DistributedOptimizer against the plain optimizer on one rank: median step time of each, in rounds."""
    import copy
    import time

    import torch

    import unison.torch as hvd

    torch.manual_seed(0)
    plain_model, batch, what = training_model(device, small)
    dist_model = copy.deepcopy(plain_model)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9)
    dist = hvd.DistributedOptimizer(torch.optim.SGD(dist_model.parameters(), lr=0.01, momentum=0.9),
                                    named_parameters=dist_model.named_parameters())

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def one(model: Any, optimizer: Any) -> float:
        sync()
        start = time.perf_counter()
        optimizer.zero_grad()
        model(batch).float().pow(2).mean().backward()
        optimizer.step()
        sync()
        return time.perf_counter() - start

    for _ in range(3):  # warm-up: cuDNN's choices, the response cache, the allocator
        one(plain_model, plain)
        one(dist_model, dist)
    times: dict[str, list[float]] = {"plain": [], "distributed": []}
    for r in range(rounds):
        order = (("plain", plain_model, plain), ("distributed", dist_model, dist))
        for side, model, optimizer in order if r % 2 == 0 else order[::-1]:
            times[side].extend(one(model, optimizer) for _ in range(steps))
    plain_s, dist_s = statistics.median(times["plain"]), statistics.median(times["distributed"])
    return {"model": what, "parameter_tensors": len(list(plain_model.parameters())),
            "plain_step_ms": plain_s * 1e3, "distributed_step_ms": dist_s * 1e3,
            "distributed_overhead": dist_s / plain_s - 1.0, "steps_per_side": rounds * steps}


def small_allreduce_latency(device: str, repeats: int) -> dict[str, float]:
    """Median seconds of ``hvd.allreduce`` of 1024 float32 (4 KiB) on `device` and on the CPU, alternated."""
    import time

    import torch

    import unison.torch as hvd

    tensors = {"device": torch.ones(1024, device=device), "cpu": torch.ones(1024)}
    times: dict[str, list[float]] = {"device": [], "cpu": []}
    for i in range(repeats + 20):
        for side in ("device", "cpu") if i % 2 == 0 else ("cpu", "device"):
            start = time.perf_counter()
            out = hvd.allreduce(tensors[side], name=f"latency.{side}")
            if side == "device" and device == "cuda":
                torch.cuda.synchronize()
            if i >= 20:  # the first ones negotiate and fill the response cache
                times[side].append(time.perf_counter() - start)
            assert float(out[0]) == 1.0
    return {"allreduce_4kib_us": statistics.median(times["device"]) * 1e6,
            "allreduce_4kib_cpu_us": statistics.median(times["cpu"]) * 1e6}


def training_measurements(device: str, small: bool, rounds: int, steps: int, repeats: int) -> dict[str, Any]:
    import unison.torch as hvd

    hvd.init()
    try:
        if device == "cuda":
            import torch

            torch.cuda.set_device(hvd.local_rank())
        result = optimizer_overhead(device, small, rounds, steps)
        result.update(small_allreduce_latency(device, repeats))
    finally:
        hvd.shutdown()
    print(f"DistributedOptimizer on {device} ({result['model']}, {result['parameter_tensors']} parameter tensors): "
          f"{result['distributed_step_ms']:.2f} ms per step against {result['plain_step_ms']:.2f} ms plain "
          f"({100 * result['distributed_overhead']:+.1f}%)")
    print(f"allreduce of 4 KiB at 1 rank: {result['allreduce_4kib_us']:.0f} us on {device}, "
          f"{result['allreduce_4kib_cpu_us']:.0f} us on the CPU")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds of the optimizer comparison")
    parser.add_argument("--steps", type=int, default=5, help="training steps per side and round")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: check the optimizer and latency measurements without a GPU (small model)")
    args = parser.parse_args()
    if args.device == "cpu":
        training_measurements("cpu", True, args.rounds, args.steps, max(args.repeats, 50))
        return 0
    reason = why_no_gpu()
    if reason:
        print(f"benchmarks/gpu.py: skipped: {reason}")
        return 0
    import time

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

    fusion_s: dict[bool, list[float]] = {True: [], False: []}
    for batched in (True, False):
        device.batched_copies = batched
        timed(fusion, stream, 3)  # compiles the kernel; warms the allocator
    for r in range(6):  # alternated rounds: batched kernel, one memcpy per tensor
        for batched in (True, False) if r % 2 == 0 else (False, True):
            device.batched_copies = batched
            fusion_s[batched].extend(timed(fusion, stream, max(args.repeats // 3, 3)))
    device.batched_copies = True
    fuse_s, fuse_memcpy_s = statistics.median(fusion_s[True]), statistics.median(fusion_s[False])
    copy_s = statistics.median(timed(plain_copy, stream, args.repeats))
    fuse_device_s = statistics.median(timed(fusion, stream, args.repeats, device_only=True))
    copy_device_s = statistics.median(timed(plain_copy, stream, args.repeats, device_only=True))
    check = cupy.concatenate([g.reshape(-1) for g in grads])
    assert bool((flat == check).all()) and all(bool((o == g).all()) for o, g in zip(outs, grads)), \
        "fusion moved the wrong bytes"

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
    small = cupy.ones(1024, dtype=cupy.float32)
    small_response = Response(ResponseKind.ALLREDUCE, ("s",), DType.FLOAT32, ((1024,),), ReduceOp.SUM, device="cuda")

    def plane_small() -> None:
        buffer = mark_ready(device, small)
        request = Request("s", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (1024,), ReduceOp.SUM, device="cuda")
        plane.run(small_response, [Entry(request, buffer, buffer, Handle("s"))])  # type: ignore[arg-type]
        stream.synchronize()

    plane_us = []
    for i in range(args.repeats + 50):
        start = time.perf_counter()
        plane_small()
        if i >= 50:
            plane_us.append((time.perf_counter() - start) * 1e6)
    result = {"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "tensors": len(counts),
              "bytes": nbytes, "fusion_pack_unpack_gbps": 2 * nbytes / fuse_s / 1e9,
              "fusion_pack_unpack_memcpy_gbps": 2 * nbytes / fuse_memcpy_s / 1e9,
              "device_copy_gbps": nbytes / copy_s / 1e9, "fusion_vs_copy": copy_s * 2 / fuse_s,
              "fusion_device_only_gbps": 2 * nbytes / fuse_device_s / 1e9,
              "device_copy_device_only_gbps": nbytes / copy_device_s / 1e9,
              "fusion_device_only_vs_copy": copy_device_s * 2 / fuse_device_s,
              "step_ms": step_s * 1e3, "responses_per_step": len(groups),
              "plane_allreduce_4kib_us": statistics.median(plane_us)}
    print(f"GPU: {result['gpu']}; {len(counts)} tensors, {nbytes / 1e6:.1f} MB")
    print(f"fusion pack+unpack {result['fusion_pack_unpack_gbps']:.1f} GB/s with the batched kernel "
          f"({100 * result['fusion_vs_copy']:.0f}% of a copy), "
          f"{result['fusion_pack_unpack_memcpy_gbps']:.1f} GB/s with one memcpy per tensor; "
          f"device-to-device copy {result['device_copy_gbps']:.1f} GB/s")
    print(f"on the device alone: fusion pack+unpack {result['fusion_device_only_gbps']:.1f} GB/s "
          f"({100 * result['fusion_device_only_vs_copy']:.0f}% of a copy's "
          f"{result['device_copy_device_only_gbps']:.1f} GB/s)")
    print(f"per-step gradient reduction on one GPU: {result['step_ms']:.2f} ms in {len(groups)} responses")
    print(f"the plane alone, 4 KiB allreduce to the end of its GPU work: {result['plane_allreduce_4kib_us']:.0f} us")
    plane.close()
    handoff.reset()  # the training measurements bind the GPU again through the engine
    result.update(training_measurements("cuda", False, args.rounds, args.steps, max(args.repeats, 200)))
    out = ROOT / "benchmarks" / "results" / "gpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
