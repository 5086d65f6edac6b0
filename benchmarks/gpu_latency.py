"""Benchmark: where the time of a small CUDA allreduce goes, at one rank, on one GPU.

Run ``python benchmarks/gpu_latency.py`` on a machine with a GPU, CuPy and a CUDA build of PyTorch.
It times each step of the torch CUDA path alone (medians of alternated repetitions, microseconds):
wrapping a tensor for the plane (DLPack and the ready event), the stream and event calls that wrap
uses, wrapping a result back, an idle ``torch.cuda.synchronize()``, and ``hvd.allreduce`` of 4 KiB
on the GPU (out of place and in place) and on the CPU. With ``--profile`` and yappi installed, it
also prints a wall-clock profile of every thread over the GPU allreduces, heaviest functions first.
Nothing is written; the numbers go to the standard output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def median_us(fn: Callable[[], Any], repeats: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def steps(repeats: int) -> dict[str, float]:
    """Each piece of the torch CUDA path alone."""
    import cupy
    import torch

    from unison.adapters.torch.buffers import cuda_buffer, from_device_result
    from unison.dtypes import DType
    from unison.gpu import handoff
    from unison.gpu.ordering import mark_ready, publish

    tensor = torch.ones(1024, device="cuda")
    device = handoff.device_for(0)
    array = cupy.from_dlpack(tensor)
    stream = device.stream()
    torch_stream = device.current_stream("torch")
    _, (result,) = publish(device, stream, [array])
    return {
        "torch.empty": median_us(lambda: torch.empty(1024, device="cuda"), repeats),
        "cupy.from_dlpack(torch)": median_us(lambda: cupy.from_dlpack(tensor), repeats),
        "torch.from_dlpack(cupy)": median_us(lambda: torch.from_dlpack(array), repeats),
        "current_stream(torch)": median_us(lambda: device.current_stream("torch"), repeats),
        "record_event": median_us(lambda: device.record_event(torch_stream), repeats),
        "mark_ready": median_us(lambda: mark_ready(device, array, "torch"), repeats),
        "cuda_buffer": median_us(lambda: cuda_buffer(tensor, in_place=True), repeats),
        "from_device_result": median_us(lambda: from_device_result(result, DType.FLOAT32), repeats),
        "torch.cuda.synchronize (idle)": median_us(torch.cuda.synchronize, repeats),
    }


def allreduces(repeats: int) -> dict[str, float]:
    """``hvd.allreduce`` of 4 KiB: GPU out of place, GPU in place and CPU, alternated."""
    import torch

    import unison.torch as hvd

    gpu, cpu = torch.ones(1024, device="cuda"), torch.ones(1024)

    def on_gpu() -> None:
        hvd.allreduce(gpu, name="latency.gpu")
        torch.cuda.synchronize()

    def on_gpu_in_place() -> None:
        hvd.allreduce_(gpu, name="latency.gpu_", op=hvd.Sum)
        torch.cuda.synchronize()

    def on_cpu() -> None:
        hvd.allreduce(cpu, name="latency.cpu")

    sides = {"allreduce 4 KiB cuda": on_gpu, "allreduce_ 4 KiB cuda (in place)": on_gpu_in_place,
             "allreduce 4 KiB cpu": on_cpu}
    times: dict[str, list[float]] = {side: [] for side in sides}
    for fn in sides.values():
        for _ in range(30):
            fn()
    for i in range(repeats):
        order = list(sides.items())
        for side, fn in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - start)
    return {side: statistics.median(t) * 1e6 for side, t in times.items()}


def profile(calls: int) -> None:
    """A wall-clock profile of every thread over `calls` GPU allreduces (needs yappi)."""
    try:
        import yappi
    except ImportError:
        print("profile: skipped (yappi is not installed)")
        return
    import torch

    import unison.torch as hvd

    gpu = torch.ones(1024, device="cuda")
    yappi.set_clock_type("wall")
    yappi.start(builtins=True)
    for _ in range(calls):
        hvd.allreduce(gpu, name="latency.gpu")
        torch.cuda.synchronize()
    yappi.stop()
    stats = sorted(yappi.get_func_stats(), key=lambda s: s.tsub, reverse=True)
    print(f"profile of {calls} GPU allreduces, every thread, per call (us): own time, total, calls per allreduce")
    for entry in stats[:40]:
        where = entry.module.split("/unison/")[-1] if "/unison/" in entry.module else Path(entry.module).name
        print(f"{entry.tsub / calls * 1e6:9.1f} {entry.ttot / calls * 1e6:9.1f} {entry.ncall / calls:6.1f}  "
              f"{where}:{entry.lineno} {entry.name}")
    for thread in yappi.get_thread_stats():
        print(f"thread {thread.name} id={thread.id}: {thread.ttot / calls * 1e6:.1f} us per allreduce")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="also profile every thread (needs yappi)")
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        print("benchmarks/gpu_latency.py: skipped: CuPy is not installed")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/gpu_latency.py: skipped: PyTorch sees no GPU")
        return 0
    import unison.torch as hvd

    hvd.init()
    try:
        torch.cuda.set_device(0)
        for name, us in {**steps(args.repeats), **allreduces(args.repeats)}.items():
            print(f"{us:9.1f} us  {name}")
        if args.profile:
            profile(args.repeats)
    finally:
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
