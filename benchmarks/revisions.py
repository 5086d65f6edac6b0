"""Two revisions of unison on the same benchmarks, their runs alternated: did a change cost speed?

Run: ``python benchmarks/revisions.py --before REV [--after REV] [--rounds 3] [--benchmarks allreduce,train_torch,latency,call_cpu,torch_distributed]``

Each revision is checked out into a temporary git worktree (``--after`` defaults to this working
tree as it is). Each side runs its own benchmark scripts (they read private modules, which a change
may move) with its own ``unison`` package first on ``PYTHONPATH``; a benchmark whose measuring
code changed between the two revisions is compared with a warning. Runs alternate by rounds,
before then after, then after then before, and so on, so that a busy spell of the machine and any
drift over the run hit both sides alike.

The numbers compared are each benchmark's own ratios, measured side by side inside one run, which
already cancel much of the machine's noise: for ``allreduce``, unison's median time over raw
mpi4py's per case; for ``train_torch``, unison's samples/s over torch DDP's and over plain mpi4py
calls, per model; for ``latency`` (calls back to back), unison's median call over raw mpi4py's and over
gloo's, and each unison side's worst round p90/p50; for ``call_cpu``, one process's CPU per call on each
rank, in microseconds (the one number that is not a ratio); for ``torch_distributed`` (named only on
request: it takes minutes), DDP's samples/s on the unison backend over gloo's per model, and the 4 KiB
``dist.all_reduce`` on unison over gloo. A benchmark script newer than the older revision runs
from this tree with that revision's package. The table gives each ratio's median over the rounds on each side and after/before.
The JSON (``benchmarks/results/revisions.json``) keeps every round, the load average and CPU steal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine import cpu_times, percent, steal_share

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MPIEXEC = Path(sys.executable).with_name("mpiexec")
TIMEOUT_SECONDS = 900

Ratios = dict[str, float]


def allreduce_ratios(results: dict) -> Ratios:
    """unison / raw mpi4py median time, per case that has both (lower is better)."""
    return {f"allreduce {c['case']} {c['bytes']} B, unison/raw time": c["unison"] / c["raw"]
            for c in results["cases"] if "unison" in c and "raw" in c}


def train_torch_ratios(results: dict) -> Ratios:
    """unison's samples/s over DDP's and over plain mpi4py calls', per model (higher is better)."""
    out: Ratios = {}
    for model, r in results["models"].items():
        for reference in ("ddp", "mpi"):  # an older benchmark may lack one
            if f"unison_over_{reference}" in r:
                out[f"train_torch {model}, unison/{reference} samples/s"] = r[f"unison_over_{reference}"]
    return out


def latency_ratios(results: dict) -> Ratios:
    """Each pair's median-call ratio (lower is better) and each unison side's worst round p90/p50."""
    out: Ratios = {f"latency {pair}": ratio for pair, ratio in results["ratios"].items()}
    for side, numbers in results["sides"].items():
        if not side.startswith(("mpi4py", "dist.all_reduce 4 KiB gloo")):
            out[f"latency {side}, worst round p90/p50"] = numbers["worst_p90_over_p50"]
    return out


def call_cpu_numbers(results: dict) -> Ratios:
    """One process's CPU per call in microseconds, per side and rank (lower is better; not a ratio: both
    sides run in the same alternation, so a busy spell hits them alike)."""
    return {f"call_cpu {side}, {who} CPU us/call": value
            for side, per_rank in results["cpu_us_per_call"].items() for who, value in per_rank.items()}


def torch_distributed_ratios(results: dict) -> Ratios:
    """DDP's samples/s on the unison backend over gloo's, per model (higher is better), and the 4 KiB
    ``dist.all_reduce``'s median on unison over gloo's (lower is better)."""
    out: Ratios = {f"torch_distributed {model}, unison/gloo DDP samples/s": r["unison_over_gloo"]
                   for model, r in results["models"].items()}
    small = results["allreduce_4kib_median_seconds"]
    out["torch_distributed dist.all_reduce 4 KiB, unison/gloo time"] = small["unison"] / small["gloo"]
    return out


BENCHMARKS: dict[str, Callable[[dict], Ratios]] = {"allreduce": allreduce_ratios, "train_torch": train_torch_ratios,
                                                   "latency": latency_ratios, "call_cpu": call_cpu_numbers,
                                                   "torch_distributed": torch_distributed_ratios}
# Run unless --benchmarks names them: DDP on the unison backend takes 5 minutes a run on 2 cores.
NOT_BY_DEFAULT = ("torch_distributed",)


def checkout(rev: str, path: Path) -> Path:
    """A worktree of `rev` at `path`; the caller removes it (`remove_checkout`)."""
    done = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"could not check {rev} out into {path}: {done.stderr.strip()}")
    return path


def remove_checkout(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def run_once(name: str, tree: Path, output: Path, quick: bool) -> dict:
    """One run of benchmark `name` on 2 ranks with `tree`'s unison; its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    script = tree / "benchmarks" / f"{name}.py"
    if not script.exists():  # a benchmark newer than the revision: this tree's script, that revision's unison
        script = HERE / f"{name}.py"
    argv = [str(MPIEXEC), "-n", "2", sys.executable, str(script), "--output", str(output),
            *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(argv, cwd=tree, env=env, timeout=TIMEOUT_SECONDS, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{name} on {tree} ran past {TIMEOUT_SECONDS} s; stopped it") from None
    if done.returncode != 0:
        raise SystemExit(f"{name} on {tree} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(output.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the older revision (any git revision)")
    parser.add_argument("--after", help="the newer revision (default: this working tree as it is)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each benchmark on each side")
    parser.add_argument("--benchmarks", default=",".join(n for n in BENCHMARKS if n not in NOT_BY_DEFAULT),
                        help=f"comma-separated, of {', '.join(BENCHMARKS)} (default: all but "
                             f"{', '.join(NOT_BY_DEFAULT)})")
    parser.add_argument("--quick", action="store_true", help="pass --quick to the benchmarks (smoke run)")
    parser.add_argument("--output", default=str(HERE / "results" / "revisions.json"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Got {args.rounds}.")
    names = list(dict.fromkeys(n for n in args.benchmarks.split(",") if n))
    if not names:
        parser.error("--benchmarks names none")
    unknown = sorted(set(names) - BENCHMARKS.keys())
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {sorted(BENCHMARKS)}")

    def describe(rev: str | None) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--short", f"{rev or 'HEAD'}^{{commit}}"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            parser.error(f"{rev!r} names no commit of {ROOT}: {done.stderr.strip()}")
        return done.stdout.strip() + ("" if rev else " (working tree)")

    sides = {"before": describe(args.before), "after": describe(args.after)}
    changed = subprocess.run(["git", "-C", str(ROOT), "diff", "--stat", args.before, *([args.after] if args.after else []),
                              "--", *(f"benchmarks/{n}.py" for n in names)],
                             capture_output=True, text=True, check=True).stdout.strip()
    if changed:
        print(f"warning: the benchmark scripts differ between the two sides:\n{changed}", flush=True)
    rounds: dict[str, list[Ratios]] = {"before": [], "after": []}
    load_before, cpu_before, start = os.getloadavg(), cpu_times(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="unison-revisions-") as scratch:
        trees = {"after": ROOT}
        try:
            trees["before"] = checkout(args.before, Path(scratch) / "before")
            if args.after:
                trees["after"] = checkout(args.after, Path(scratch) / "after")
            for round_index in range(args.rounds):
                for side in ("before", "after") if round_index % 2 == 0 else ("after", "before"):
                    ratios: Ratios = {}
                    for name in names:
                        output = Path(scratch) / f"{name}-{side}.json"
                        output.unlink(missing_ok=True)  # a run that writes nothing must not read the last one's
                        results = run_once(name, trees[side], output, args.quick)
                        ratios.update(BENCHMARKS[name](results))
                    rounds[side].append(ratios)
                    print(f"round {round_index + 1}/{args.rounds}: {side} done", flush=True)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    remove_checkout(tree)
    steal = steal_share(cpu_before, cpu_times())
    # Ratios every round of both sides has (a case or model one revision lacks is named, not compared).
    common = [key for key in rounds["before"][0] if all(key in r for side in rounds.values() for r in side)]
    unmatched = sorted({key for side in rounds.values() for r in side for key in r} - set(common))
    if unmatched:
        print(f"warning: not on both sides, not compared: {unmatched}", flush=True)
    if not common:
        raise SystemExit("the two sides have no ratio in common")
    medians = {side: {key: statistics.median(r[key] for r in rounds[side]) for key in common} for side in rounds}
    report = {"before": sides["before"], "after": sides["after"], "rounds": args.rounds, "quick": args.quick,
              "load_before": load_before, "load_after": os.getloadavg(), "steal_share": steal,
              "benchmark_scripts_changed": changed, "not_compared": unmatched, "seconds": time.perf_counter() - start, "each_round": rounds, "medians": medians,
              "after_over_before": {k: medians["after"][k] / medians["before"][k] for k in medians["before"]}}
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(f"before {sides['before']}, after {sides['after']}: {args.rounds} rounds alternated; load "
          f"{load_before[0]:.2f} -> {report['load_after'][0]:.2f}; CPU steal {percent(steal)}")
    width = max(map(len, medians["before"]))
    print(f"{'ratio (median of rounds)':<{width}}  {'before':>8}  {'after':>8}  after/before")
    for key in medians["before"]:
        print(f"{key:<{width}}  {medians['before'][key]:8.3f}  {medians['after'][key]:8.3f}  "
              f"{report['after_over_before'][key]:.3f}")


if __name__ == "__main__":
    main()
