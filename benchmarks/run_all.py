"""Run every local benchmark in turn, then plot the results and print one summary table.

Run: ``python benchmarks/run_all.py [--quick] [--only NAME[,NAME]] [--results-dir DIR]`` (``make bench``).

The benchmarks run one after the other as subprocesses, the MPI ones under the ``mpiexec`` next to
this interpreter with 2 ranks, each with its default settings (about 5 minutes in all on a 2-core
machine; ``--quick`` passes ``--quick`` to each, for a smoke run of under a minute). Their output is
streamed as it comes. Each writes ``<name>.json`` into the results folder; from those this script
draws ``allreduce.png``, ``training_throughput.png``, ``compression.png`` and
``coordinator_scale.png``, and writes the summary table, with the load average at start and end and
the share of CPU time the hypervisor stole during each benchmark (`machine.py`), to ``summary.md``.
A failing benchmark does not stop the others: the script goes on and exits non-zero at the end,
naming the ones that failed. ``benchmarks/multihost.py`` is not run here (it needs root;
``make bench-multihost``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from machine import cpu_times, percent, steal_share  # noqa: E402

HERE = Path(__file__).resolve().parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
RANKS = 2
# Benchmark name -> whether it runs under mpiexec; in the order they run.
BENCHMARKS = {"allreduce": True, "train_torch": True, "train_tensorflow": True, "compression": True,
              "coordinator_scale": False, "autotune": True, "torch_distributed": True}
TIMEOUT_SECONDS = 900
KiB, MiB = 1024, 1024 * 1024
Results = dict[str, Any]  # one benchmark's JSON


@dataclass(frozen=True)
class Outcome:
    """How one benchmark's subprocess ended."""

    name: str
    seconds: float
    returncode: int
    results: Results | None  # None when it failed or wrote no JSON
    steal: float | None = None  # share of CPU time stolen by the hypervisor while it ran

    @property
    def ok(self) -> bool:
        """Whether it exited 0 and wrote its JSON."""
        return self.returncode == 0 and self.results is not None


def command(name: str, quick: bool, output: Path) -> list[str]:
    """The command line that runs benchmark `name`, writing its JSON to `output`."""
    script = [sys.executable, str(HERE / f"{name}.py"), "--output", str(output), *(["--quick"] if quick else [])]
    return [str(MPIEXEC), "-n", str(RANKS), *script] if BENCHMARKS[name] else script


def run_benchmark(name: str, quick: bool, results_dir: Path) -> Outcome:
    """Run one benchmark with its output streamed to ours; read back the JSON it wrote."""
    # Written aside and moved into place on success: a failed run leaves the previous results as they were.
    output = results_dir / f"{name}.json.tmp"
    output.unlink(missing_ok=True)
    argv = command(name, quick, output)
    print(f"\n=== {name}: {' '.join(argv)}", flush=True)
    start, cpu_before = time.perf_counter(), cpu_times()
    process = subprocess.Popen(argv, cwd=HERE.parent)
    try:
        returncode = process.wait(TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        print(f"=== {name}: still running after {TIMEOUT_SECONDS} s; stopping it", flush=True)
        process.terminate()  # mpiexec passes SIGTERM on to its ranks
        try:
            returncode = process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
    seconds, steal = time.perf_counter() - start, steal_share(cpu_before, cpu_times())
    results = None
    if returncode == 0 and output.exists():
        results = json.loads(output.read_text())
        output.replace(output.with_suffix(""))
    output.unlink(missing_ok=True)
    print(f"=== {name}: exit {returncode} after {seconds:.0f} s"
          f"{'' if returncode or results is not None else ', but it wrote no results'}", flush=True)
    return Outcome(name, seconds, returncode, results, steal)


def succeeded(outcomes: list[Outcome]) -> dict[str, Results]:
    """The results of the benchmarks that succeeded, by name."""
    return {o.name: o.results for o in outcomes if o.returncode == 0 and o.results is not None}


def size_label(nbytes: float) -> str:
    """Format a byte count as KiB or MiB: ``size_label(4096) == "4 KiB"``."""
    return f"{nbytes / MiB:g} MiB" if nbytes >= MiB else f"{nbytes / KiB:g} KiB"


def time_label(seconds: float) -> str:
    """Format a duration in µs below a millisecond, else in ms."""
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def plot_allreduce(data: Results, path: Path) -> None:
    """Allreduce time against message size, unison and raw mpi4py, log-log."""
    cases = [c for c in data["cases"] if c["case"] == "allreduce"]
    sizes = [c["bytes"] for c in cases]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for side, label in (("raw", "raw mpi4py Allreduce"), ("unison", "unison allreduce_")):
        ax.loglog(sizes, [c[side] * 1e3 for c in cases], marker="o", label=label)
    ax.set_xticks(sizes, [size_label(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("message size (float32 buffer)")
    ax.set_ylabel("time per allreduce, ms (median, log)")
    ax.set_title(f"Allreduce (sum) on {data['size']} ranks: unison vs raw mpi4py")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    save(fig, path)


def plot_training(torch_data: Results | None, tf_data: Results | None, path: Path) -> None:
    """Training throughput as a share of the no-communication ceiling, per model and framework."""
    groups: list[tuple[str, dict[str, float]]] = []
    for name, model in (torch_data or {}).get("models", {}).items():
        groups.append((f"PyTorch {name}\n{model['parameters'] / 1e6:.1f} M params", dict(model["share_of_ceiling"])))
    if tf_data:
        groups.append((f"TensorFlow mlp\n{tf_data['parameters'] / 1e6:.1f} M params",
                       {"unison": tf_data["share_of_ceiling"], "mpi": tf_data["mpi_share_of_ceiling"]}))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sides = (("unison", "unison"), ("ddp", "torch DDP (gloo)"), ("mpi", "plain mpi4py calls after the gradients"))
    present = [side for side in sides if any(side[0] in shares for _, shares in groups)]
    width = 0.8 / max(len(present), 1)
    for index, (side, label) in enumerate(present):
        xs, values = [], []
        for i, (_, shares) in enumerate(groups):
            if side not in shares:
                continue
            mine = [s for s, _ in present if s in shares]  # the bars of this group, centred together
            xs.append(i + (mine.index(side) - (len(mine) - 1) / 2) * width)
            values.append(100 * shares[side])
        bars = ax.bar(xs, values, width, label=label, color=f"C{index}")
        ax.bar_label(bars, fmt="%.0f%%", fontsize="small")
    ax.axhline(100, color="grey", linestyle="--", linewidth=1, label="no-communication ceiling")
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylim(0, 145)
    ax.set_ylabel("throughput, % of the no-communication ceiling")
    ax.set_title(f"Training throughput on {RANKS} ranks x 1 thread (medians)")
    ax.legend(loc="upper center", ncol=3, fontsize="small")
    save(fig, path)


def plot_compression(data: Results, path: Path) -> None:
    """Step time and bytes per step for each compression scheme."""
    names = list(data["schemes"])
    schemes = [data["schemes"][n] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    bars = left.bar(names, [s["median_seconds_per_step"] * 1e3 for s in schemes], color="tab:blue")
    left.bar_label(bars, fmt="%.0f")
    left.margins(y=0.1)
    left.set_ylabel("step time, ms (median)")
    left.set_title("Step time per scheme")
    width = 0.4
    xs = range(len(names))
    megabytes: list[float] = []
    for offset, key, label in ((-width / 2, "median_payload_bytes_per_step", "payload (handed to the engine)"),
                               (width / 2, "median_wire_bytes_per_step", "wire (moved by MPI)")):
        values = [s[key] / 1e6 for s in schemes]
        megabytes += values
        right.bar([x + offset for x in xs], values, width, label=label)
    right.set_xticks(xs, names)
    right.set_yscale("log")
    # Room below the smallest bar, and above the largest for the legend.
    right.set_ylim(min(megabytes) / 3, max(megabytes) * 30)
    right.set_ylabel("MB per step on rank 0 (log)")
    right.set_title("Bytes per step")
    right.legend(loc="upper center", ncol=2, fontsize="small")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Gradient compression, {data['parameters'] / 1e6:.1f} M-parameter MLP, {data['ranks']} ranks, "
                 f"batch {data['batch_size']}")
    save(fig, path)


def plot_coordinator(data: Results, path: Path) -> None:
    """Coordinator cycle latency p50 against the number of simulated ranks, cached and uncached."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes: list[int] = []
    for mode in ("cached", "uncached"):
        cases = [c for c in data["cases"] if c["mode"] == mode]
        sizes = [c["size"] for c in cases]
        ax.loglog(sizes, [c["p50_ms"] for c in cases], marker="o", label=f"{mode} cycle")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("simulated ranks N")
    ax.set_ylabel("cycle latency p50 seen by rank 0, ms (log)")
    ax.set_title(f"gRPC coordinator on loopback, {data['tensors_per_cycle']} tensors per rank, "
                 f"{data.get('ranks_per_host', 1)} ranks per host")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    save(fig, path)


def save(fig: plt.Figure, path: Path) -> None:
    """Write `fig` to `path` as a PNG and release it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def plots(results: dict[str, Results], results_dir: Path) -> None:
    """Draw every plot whose benchmarks produced results in this run."""
    if "allreduce" in results:
        plot_allreduce(results["allreduce"], results_dir / "allreduce.png")
    if "train_torch" in results or "train_tensorflow" in results:
        plot_training(results.get("train_torch"), results.get("train_tensorflow"),
                      results_dir / "training_throughput.png")
    if "compression" in results:
        plot_compression(results["compression"], results_dir / "compression.png")
    if "coordinator_scale" in results:
        plot_coordinator(results["coordinator_scale"], results_dir / "coordinator_scale.png")


def summary_rows(results: dict[str, Results]) -> list[tuple[str, str, str, str, str]]:
    """Headline numbers: (benchmark, case, unison, reference, unison / reference)."""
    rows: list[tuple[str, str, str, str, str]] = []
    for case in results.get("allreduce", {}).get("cases", []):
        if case["case"] == "allreduce":
            rows.append(("allreduce", f"{size_label(case['bytes'])}, vs raw mpi4py", time_label(case["unison"]),
                         time_label(case["raw"]), f"{case['unison'] / case['raw']:.2f}x"))
        elif case["case"] == "resnet50_step":
            rows.append(("allreduce", f"ResNet-50 step, {case['tensors']} tensors vs one fused raw call",
                         time_label(case["unison"]), time_label(case["raw"]), f"{case['unison'] / case['raw']:.2f}x"))
    for name, model in results.get("train_torch", {}).get("models", {}).items():
        share = model["share_of_ceiling"]
        rows.append(("train_torch", f"{name} ({model['parameters'] / 1e6:.1f} M params), share of no-comm "
                     "ceiling vs torch DDP", f"{share['unison']:.0%}", f"{share['ddp']:.0%}",
                     f"{model['unison_over_ddp']:.2f}x"))
        rows.append(("train_torch", f"{name}, share of no-comm ceiling vs plain mpi4py calls after the "
                     "gradients", f"{share['unison']:.0%}", f"{share['mpi']:.0%}", f"{model['unison_over_mpi']:.2f}x"))
    if "train_tensorflow" in results:
        tf_data = results["train_tensorflow"]
        rows.append(("train_tensorflow", f"mlp ({tf_data['parameters'] / 1e6:.1f} M params), share of no-comm "
                     "ceiling vs plain mpi4py calls after the gradients", f"{tf_data['share_of_ceiling']:.0%}",
                     f"{tf_data['mpi_share_of_ceiling']:.0%}",
                     f"{tf_data['share_of_ceiling'] / tf_data['mpi_share_of_ceiling']:.2f}x"))
    if "compression" in results:
        data = results["compression"]
        base = data["schemes"][data["baseline"]]
        for name, scheme in data["schemes"].items():
            if name == data["baseline"]:
                continue
            rows.append(("compression", f"{name} vs {data['baseline']}: step time; wire MB per step",
                         f"{scheme['median_seconds_per_step'] * 1e3:.1f} ms; "
                         f"{scheme['median_wire_bytes_per_step'] / 1e6:.2f} MB",
                         f"{base['median_seconds_per_step'] * 1e3:.1f} ms; "
                         f"{base['median_wire_bytes_per_step'] / 1e6:.2f} MB",
                         f"{scheme['median_seconds_per_step'] / base['median_seconds_per_step']:.2f}x; "
                         f"{scheme['median_wire_bytes_per_step'] / base['median_wire_bytes_per_step']:.3f}x"))
    if "coordinator_scale" in results:
        cases = results["coordinator_scale"]["cases"]
        largest = max(c["size"] for c in cases)
        for case in (c for c in cases if c["size"] == largest):
            rows.append(("coordinator_scale", f"N={largest}, {case['mode']} cycle: p50; master CPU per cycle",
                         f"{case['p50_ms']:.2f} ms; {case['master_cpu_ms_per_cycle']:.2f} ms", "–", "–"))
    for name, model in results.get("autotune", {}).get("models", {}).items():
        rate = model["median_samples_per_second"]
        rows.append(("autotune", f"{name}, samples/s with UNISON_AUTOTUNE=1 vs the defaults",
                     f"{rate['tuned']:.1f}", f"{rate['default']:.1f}", f"{model['tuned_over_default']:.2f}x"))
    if "torch_distributed" in results:
        data = results["torch_distributed"]
        for name, model in data["models"].items():
            rate = model["median_samples_per_second"]
            rows.append(("torch_distributed", f"DDP on {name}, samples/s: backend unison vs gloo",
                         f"{rate['unison']:.1f}", f"{rate['gloo']:.1f}", f"{model['unison_over_gloo']:.2f}x"))
            if "nocomm" in rate:
                rows.append(("torch_distributed", f"DDP on {name}, samples/s: no communication (the ceiling) vs gloo",
                             f"{rate['nocomm']:.1f}", f"{rate['gloo']:.1f}", f"{model['nocomm_over_gloo']:.2f}x"))
        small = data["allreduce_4kib_median_seconds"]
        if small:
            rows.append(("torch_distributed", "4 KiB dist.all_reduce, median: unison vs gloo",
                         time_label(small["unison"]), time_label(small["gloo"]),
                         f"{small['unison'] / small['gloo']:.2f}x"))
    return rows


def summary(outcomes: list[Outcome], load_start: tuple[float, ...], load_end: tuple[float, ...],
            seconds: float, quick: bool, steal: float | None = None) -> str:
    """The markdown summary: conditions of the run, then one table of headline numbers."""
    load = "/".join(f"{v:.2f}" for v in load_start), "/".join(f"{v:.2f}" for v in load_end)
    failed = [o.name for o in outcomes if not o.ok]
    lines = [
        "# Benchmark summary" + (" (quick smoke run)" if quick else ""),
        "",
        f"{os.cpu_count()} cores; load average (1/5/15 min) at start {load[0]}, at end {load[1]}; "
        f"{seconds / 60:.1f} minutes in all ("
        + ", ".join(f"{o.name} {o.seconds:.0f} s" for o in outcomes) + ").",
        f"CPU steal (time the hypervisor gave to other guests, which the load average does not show): "
        f"{percent(steal)} over the run ("
        + ", ".join(f"{o.name} {percent(o.steal)}" for o in outcomes) + ").",
        "Failed: " + (", ".join(failed) if failed else "none") + ". Timings on a shared machine vary; "
        "compare within one run.",
        "",
        "| benchmark | case | unison | reference | unison / reference |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in summary_rows(succeeded(outcomes))]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke run)")
    parser.add_argument("--only", help=f"comma-separated subset of: {','.join(BENCHMARKS)}")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where the JSON, PNG and summary.md files go (default: benchmarks/results)")
    args = parser.parse_args()
    names = list(BENCHMARKS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"--only names benchmarks {unknown} that do not exist; choose from {','.join(BENCHMARKS)}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    load_start, start, cpu_start = os.getloadavg(), time.perf_counter(), cpu_times()
    print(f"load average at start: {'/'.join(f'{v:.2f}' for v in load_start)} (1/5/15 min)", flush=True)
    outcomes = [run_benchmark(name, args.quick, args.results_dir) for name in names]
    load_end, steal = os.getloadavg(), steal_share(cpu_start, cpu_times())
    print()
    plots(succeeded(outcomes), args.results_dir)
    text = summary(outcomes, load_start, load_end, time.perf_counter() - start, args.quick, steal)
    (args.results_dir / "summary.md").write_text(text)
    print(f"\n{text}\nwrote {args.results_dir / 'summary.md'}")
    failed = [o.name for o in outcomes if not o.ok]
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
