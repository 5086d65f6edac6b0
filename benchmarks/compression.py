"""Gradient compression schemes side by side: bytes per step, step time, digits accuracy, 2 ranks.

Run: mpiexec -n 2 python benchmarks/compression.py [--rounds 3] [--steps 5] [--quick] [--output PATH]

For the 11.5 M-parameter MLP of train_torch.py each scheme trains `steps` steps per round; rounds
alternate the schemes so machine noise hits all alike, and the table shows medians. "payload" is the
bytes this rank hands to the engine per step (what the scheme promises); "wire" is the engine's own
count of bytes moved by MPI per step on this rank (allgather counts everything received). "break-even"
is the link bandwidth below which the scheme's extra compute is repaid by the bytes it saves. The
digits column trains the small model of the tests to the end and reports test accuracy. Rank 0 also
writes everything it prints, with the samples of every round, to ``benchmarks/results/compression.json``
(break-even there: Gbit/s, or "never" / "always").
"""

from __future__ import annotations

import os

# One thread per rank, for NumPy's BLAS (PowerSGD's products) as for torch: two ranks on two cores
# with OpenBLAS's default of one thread per core ran PowerSGD 2.2x slower (oversubscription).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import unison
import unison.torch as hvd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_torch import mlp, write_json  # noqa: E402

SCHEMES = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    "bf16": lambda: hvd.Compression.bf16,
    "topk0.01": lambda: hvd.Compression.topk(0.01),
    "thresh1e-4": lambda: hvd.Compression.threshold(1e-4),
    "partial0.25": lambda: hvd.Compression.partial(0.25),
    "powersgd4": lambda: hvd.Compression.powersgd(4),
}


def wire_bytes() -> int:
    return int(unison.statistics().backend["data_bytes"])


def run(scheme: str, batch: int, steps: int) -> tuple[float, float, float]:
    """Return (seconds per step, payload bytes per step, wire bytes per step), after 1 warm-up step."""
    torch.manual_seed(0)
    model = mlp()
    x, y = torch.randn(batch, 1024), torch.randn(batch, 512)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                   named_parameters=model.named_parameters(), compression=SCHEMES[scheme]())
    for step in range(steps + 1):
        if step == 1:
            hvd.barrier()
            start, payload, wire = time.perf_counter(), opt.statistics()["payload_bytes"], wire_bytes()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    hvd.barrier()
    seconds = (time.perf_counter() - start) / steps
    return seconds, (opt.statistics()["payload_bytes"] - payload) / steps, (wire_bytes() - wire) / steps


def digits(scheme: str) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "multirank"))
    from test_compression_torch import digits_accuracy

    return digits_accuracy(SCHEMES[scheme]())


def _percent(value: float) -> str:
    return "-" if value != value else f"{value:.1%}"  # NaN: not measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 5; 2 with --quick)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--digits", action=argparse.BooleanOptionalAction,
                        help="train the digits model per scheme for the accuracy column (default: on, "
                             "off with --quick)")
    parser.add_argument("--quick", action="store_true", help="one round of a few steps, no digits (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "compression.json"))
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (2 if args.quick else 5)
    with_digits = not args.quick if args.digits is None else args.digits
    torch.set_num_threads(1)
    hvd.init()
    names = args.schemes.split(",")
    load_before = os.getloadavg()
    samples: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in names:
            samples[name].append(run(name, args.batch_size, steps))
    load_after = os.getloadavg()
    accuracy = {name: digits(name) if with_digits else float("nan") for name in names}
    if hvd.rank() == 0:
        params = sum(p.numel() for p in mlp().parameters())
        print(f"MLP {params / 1e6:.2f} M parameters, batch {args.batch_size} per rank, {hvd.size()} ranks, "
              f"1 thread each; {rounds} alternating rounds of {steps} steps; load average "
              f"before {load_before[0]:.2f}/{load_before[1]:.2f}, after {load_after[0]:.2f}/"
              f"{load_after[1]:.2f} (1/5 min)")
        print(f"{'scheme':<12} {'step ms':>8} {'payload MB':>11} {'wire MB':>8} {'payload/none':>13} "
              f"{'break-even':>12} {'digits acc':>10}")
        med = {n: [statistics.median(s[i] for s in samples[n]) for i in range(3)] for n in names}
        base = med.get("none", med[names[0]])
        schemes: dict[str, dict[str, object]] = {}
        for name in names:
            seconds, payload, wire = med[name]
            saved, extra = base[2] - wire, seconds - base[0]
            break_even: float | str
            if saved <= 0:
                even = break_even = "never"
            elif extra <= 0:
                even = break_even = "always"
            else:
                break_even = saved / extra / 1e9 * 8
                even = f"{break_even:.2f} Gb/s"
            print(f"{name:<12} {seconds * 1e3:>8.1f} {payload / 1e6:>11.2f} {wire / 1e6:>8.2f} "
                  f"{payload / base[1]:>12.1%} {even:>12} {_percent(accuracy[name]):>10}")
            schemes[name] = {
                "seconds_per_step": [s[0] for s in samples[name]],
                "payload_bytes_per_step": [s[1] for s in samples[name]],
                "wire_bytes_per_step": [s[2] for s in samples[name]],
                "median_seconds_per_step": seconds, "median_payload_bytes_per_step": payload,
                "median_wire_bytes_per_step": wire, "payload_share_of_baseline": payload / base[1],
                "break_even_gbit_per_second": break_even,
                "digits_accuracy": None if accuracy[name] != accuracy[name] else accuracy[name]}
        print("(medians; MB per step on rank 0; break-even: scheme pays off on links slower than this)")
        write_json(Path(args.output), {
            "ranks": hvd.size(), "threads_per_rank": 1, "rounds": rounds, "steps": steps,
            "batch_size": args.batch_size, "parameters": params, "baseline": "none" if "none" in med else names[0],
            "load_before": load_before, "load_after": load_after, "schemes": schemes})
    hvd.shutdown()


if __name__ == "__main__":
    main()
