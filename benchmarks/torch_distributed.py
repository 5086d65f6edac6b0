"""torch.distributed backends side by side: DDP on "unison", on "gloo", and on gloo in DETAIL debug mode.

Run: mpiexec -n 2 python benchmarks/torch_distributed.py [--steps 48] [--blocks 8] [--quick] [--output PATH]

Two DDP copies of one model, each on its own process group of every rank: ``unison`` (the unison
backend) and ``gloo``. They take turns step by step (`turns.take_turns`), each rank on one thread. Where
a model's memory lands moves its step time by up to 13% on the 2-core machine (two DDP copies on two
``unison`` groups, built one after the other, differed by that much within one run), so the steps are
taken in blocks: each block builds fresh copies, in an order rotated by one each block, and the
headline ratio is the median of the blocks' ratios; the table also shows samples/s from each mode's
median step over all blocks. A third copy, ``nocomm``, is DDP with a communication hook that returns
each bucket at once: DDP's own work (copying gradients into buckets and out) with no communication,
the ceiling that no backend can pass (its gradients are not averaged). A third group, ``gloo-detail``, is
gloo wrapped as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps it (a check of every collective's shape and
type over a second gloo group before it runs: torch's own tool for the desynchronisation the unison
backend reports by name). DDP does not run on it: in torch 2.13.0 DDP's construction crashes the
process (SIGSEGV) in DETAIL mode, with gloo alone and no unison in the process. Then the latency of a
4 KiB ``dist.all_reduce`` on each of the three groups (alternating, median), and the time until a rank learns of a collective issued with another shape on the other
rank, on each rank: unison raises at once on both; gloo may return a wrong result on one rank and wait
for its own timeout (10 s here; 2 s with --quick) on the other; DETAIL mode raises after its check. The groups get their store through
unison (no MASTER_ADDR needed). Rank 0 writes everything to ``benchmarks/results/torch_distributed.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypedDict

import torch
import torch.distributed as dist
from machine import cpu_times, percent, steal_share
from train_torch import MODELS, loss_of
from turns import take_turns

import unison.torch as hvd

MODES = ("unison", "gloo", "gloo-detail")
DDP_MODES = ("unison", "gloo", "nocomm")
MISMATCH_TIMEOUT = timedelta(seconds=10)
QUICK_MISMATCH_TIMEOUT = timedelta(seconds=2)  # --quick: gloo's wait for the rank it left behind


class Block(TypedDict):
    """One block of freshly built DDP copies: the order they were built in, their medians, the ratio."""

    built_in_order: list[str]
    median_step_seconds: dict[str, float]
    unison_over_gloo: float
    nocomm_over_gloo: float


def groups() -> dict[str, dist.ProcessGroup]:
    """One group of every rank per mode (DETAIL mode wraps the gloo group it makes)."""
    made = {"unison": dist.new_group(backend="unison"), "gloo": dist.new_group(backend="gloo")}
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    made["gloo-detail"] = dist.new_group(backend="gloo")
    dist.set_debug_level(dist.DebugLevel.OFF)
    return made


def no_communication(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses string annotations
    """A DDP communication hook that hands each bucket back as it is (the `nocomm` ceiling)."""
    done = torch.futures.Future()  # of the bucket's tensor
    done.set_result(bucket.buffer())
    return done


def make_step(name: str, group: dist.ProcessGroup, batch: int, communicate: bool = True):
    torch.manual_seed(0)
    model = MODELS[name][0]()
    x, y = MODELS[name][1](batch)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    if not communicate:
        ddp.register_comm_hook(None, no_communication)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        loss_of(name, ddp(x), y).backward()
        opt.step()

    return step


def ddp_blocks(name: str, made: dict[str, dist.ProcessGroup], batch: int, steps: int, blocks: int,
               warmup: int) -> tuple[dict[str, list[float]], list[Block]] | None:
    """Each DDP mode's step times over `blocks` blocks of fresh models (built in rotated order), and each
    block's medians and unison-over-gloo ratio; rank 0 gets them, the other ranks None."""
    pooled: dict[str, list[float]] = {mode: [] for mode in DDP_MODES}
    per_block: list[Block] = []
    per = -(-steps // blocks)
    for block in range(blocks):
        order = DDP_MODES[block % len(DDP_MODES):] + DDP_MODES[:block % len(DDP_MODES)]
        built = {mode: make_step(name, made["unison" if mode == "nocomm" else mode], batch, mode != "nocomm")
                 for mode in order}
        times = take_turns({mode: built[mode] for mode in DDP_MODES}, per, warmup=warmup)
        del built
        gc.collect()
        if times is None:
            continue
        medians = {mode: statistics.median(values) for mode, values in times.items()}
        per_block.append({"built_in_order": list(order), "median_step_seconds": medians,
                          "unison_over_gloo": medians["gloo"] / medians["unison"],
                          "nocomm_over_gloo": medians["gloo"] / medians["nocomm"]})
        for mode, values in times.items():
            pooled[mode].extend(values)
    return (pooled, per_block) if per_block else None


def latency(made: dict[str, dist.ProcessGroup], rounds: int) -> dict[str, float]:
    """Median seconds of a 4 KiB all_reduce on each group, alternating the groups call by call."""
    tensor = torch.ones(1024)

    def call(group: dist.ProcessGroup) -> Callable[[], object]:
        return lambda: dist.all_reduce(tensor, group=group)

    times = take_turns({mode: call(group) for mode, group in made.items()}, rounds, warmup=20)
    return {mode: statistics.median(values) for mode, values in (times or {}).items()}


def time_to_error(backend: str, detail: bool, timeout: timedelta) -> tuple[float, str]:
    """Seconds until this rank's mismatched all_reduce returned or raised, and what happened."""
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    group = dist.new_group(backend=backend, timeout=timeout)
    dist.set_debug_level(dist.DebugLevel.OFF)
    dist.all_reduce(torch.ones(1), group=group)  # the group is up on every rank
    tensor = torch.ones(3 if hvd.rank() == 0 else 4)
    start = time.perf_counter()
    try:
        dist.all_reduce(tensor, group=group)
        outcome = f"returned {tensor.tolist()}"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    seconds = time.perf_counter() - start
    hvd.barrier()  # a rank that gloo left waiting rejoins before the next group is made
    return seconds, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="timed steps per mode (default 48; 3 with --quick)")
    parser.add_argument("--blocks", type=int, help="blocks of freshly built models the steps are spread over "
                        "(default 8; 1 with --quick)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--quick", action="store_true", help="a few steps (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "torch_distributed.json"))
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 48)
    blocks = args.blocks or (1 if args.quick else 8)
    if steps < 1 or blocks < 1 or blocks > steps:
        parser.error(f"--steps ({steps}) and --blocks ({blocks}) must be positive, with no more blocks than steps")
    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("unison")
    made = groups()
    load_before, cpu_before = os.getloadavg(), cpu_times()
    names = args.models.split(",")
    # DDP rebuilds its buckets after the first step: every block's fresh copies warm up past that
    ddp = {name: ddp_blocks(name, made, args.batch_size, steps, blocks, warmup=2 if args.quick else 5)
           for name in names}
    small = latency(made, 20 if args.quick else 300)
    timeout = QUICK_MISMATCH_TIMEOUT if args.quick else MISMATCH_TIMEOUT
    errors = {mode: hvd.allgather_object(time_to_error("unison" if mode == "unison" else "gloo",
                                                       mode == "gloo-detail", timeout))
              for mode in MODES} if hvd.size() > 1 else {}
    load_after, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if hvd.rank() == 0:
        samples = hvd.size() * args.batch_size
        print(f"{hvd.size()} ranks, 1 thread each, {steps} steps per mode taking turns step by step in {blocks} "
              f"blocks of fresh models; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
              f"(1 min); CPU steal {percent(steal)}")
        print(f"{'DDP on':<8} {'unison':>9} {'gloo':>9} {'unison/gloo':>12} {'nocomm/gloo':>12}   unison/gloo per block")
        models = {}
        for name in names:
            pooled, per_block = ddp[name] or ({}, [])
            med = {m: samples / statistics.median(pooled[m]) for m in DDP_MODES}
            ratio = statistics.median(block["unison_over_gloo"] for block in per_block)
            ceiling = statistics.median(block["nocomm_over_gloo"] for block in per_block)
            shown = " ".join(f"{block['unison_over_gloo']:.2f}" for block in per_block)
            print(f"{name:<8} {med['unison']:>9.1f} {med['gloo']:>9.1f} {ratio:>11.2f}x {ceiling:>11.2f}x   {shown}")
            models[name] = {"step_seconds": pooled, "median_samples_per_second": med, "blocks": per_block,
                            "unison_over_gloo": ratio, "nocomm_over_gloo": ceiling}
        print("(samples/s from the median step over all blocks, global across ranks; the ratio is the median of "
              "the blocks' ratios; nocomm is DDP with no communication, the ceiling)")
        print("4 KiB all_reduce, median: " + ", ".join(f"{m} {s * 1e6:.0f} us" for m, s in small.items()))
        for mode, per_rank in errors.items():
            for rank, (seconds, outcome) in enumerate(per_rank):
                print(f"mismatched shapes, {mode}, rank {rank}: {seconds:.3f} s, {outcome}")
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "ranks": hvd.size(), "threads_per_rank": 1, "steps": -(-steps // blocks) * blocks, "blocks": blocks,
            "batch_size": args.batch_size,
            "load_before": load_before, "load_after": load_after, "steal_share": steal, "models": models,
            "allreduce_4kib_median_seconds": small,
            "mismatch": {m: [{"rank": r, "seconds": s, "outcome": o} for r, (s, o) in enumerate(per_rank)]
                         for m, per_rank in errors.items()}}, indent=2) + "\n")
        print(f"wrote {path}")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
