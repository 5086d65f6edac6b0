"""`benchmarks/run_all.py --quick` runs every local benchmark and leaves its JSON, plots and summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(450)]  # 50 s alone, 180 s in make test's tier

# The keys each benchmark's JSON must have, beyond which the plots and the summary read.
EXPECTED_KEYS = {
    "allreduce": {"size", "load_before", "load_after", "cases"},
    "train_torch": {"ranks", "steps", "warmup_steps", "batch_size", "load_before", "load_after", "models"},
    "train_tensorflow": {"ranks", "steps", "batch_size", "parameters", "load_before", "load_after",
                         "seconds_per_step", "median_seconds_per_step", "share_of_ceiling",
                         "mpi_share_of_ceiling", "adapter_overhead_seconds"},
    "compression": {"ranks", "rounds", "steps", "batch_size", "parameters", "baseline", "load_before",
                    "load_after", "schemes"},
    "coordinator_scale": {"cycles", "tensors_per_cycle", "load_before", "load_after", "cases"},
    "torch_distributed": {"ranks", "steps", "models", "allreduce_4kib_median_seconds", "mismatch"},
}
PLOTS = ["allreduce.png", "training_throughput.png", "compression.png", "coordinator_scale.png"]


def run_all(results_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick",
                           "--results-dir", str(results_dir), *args],
                          capture_output=True, text=True, timeout=430, cwd=ROOT, env=env)


def test_quick_run_writes_every_json_plot_and_the_summary(tmp_path: Path) -> None:
    done = run_all(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name, keys in EXPECTED_KEYS.items():
        results = json.loads((tmp_path / f"{name}.json").read_text())
        assert keys <= results.keys(), (name, sorted(results))
    torch_results = json.loads((tmp_path / "train_torch.json").read_text())
    for model in torch_results["models"].values():
        assert {"unison", "ddp", "none", "mpi"} == model["step_seconds"].keys()
        assert model["share_of_ceiling"]["mpi"] > 0 and model["unison_over_mpi"] > 0
        assert all(len(v) == torch_results["steps"] for v in model["step_seconds"].values())
    tf_results = json.loads((tmp_path / "train_tensorflow.json").read_text())
    assert {"unison", "nocomm", "mpi", "raw"} == tf_results["seconds_per_step"].keys()
    assert all(len(v) == tf_results["steps"] for v in tf_results["seconds_per_step"].values())
    torch_dist = json.loads((tmp_path / "torch_distributed.json").read_text())
    assert {"unison", "gloo", "nocomm"} == torch_dist["models"]["mlp"]["step_seconds"].keys()
    unison_errors = torch_dist["mismatch"]["unison"]
    assert [entry["outcome"].split(":")[0] for entry in unison_errors] == ["MismatchError"] * 2, unison_errors
    schemes = json.loads((tmp_path / "compression.json").read_text())["schemes"]
    assert {"none", "fp16", "powersgd4"} <= schemes.keys()
    assert schemes["fp16"]["median_wire_bytes_per_step"] < schemes["none"]["median_wire_bytes_per_step"]
    for plot in PLOTS:
        assert (tmp_path / plot).read_bytes()[:8] == PNG_SIGNATURE, plot
    summary = (tmp_path / "summary.md").read_text()
    assert summary.strip() in done.stdout  # printed as written
    for name in EXPECTED_KEYS:
        assert f"| {name} |" in summary, name
    assert summary.count("vs plain mpi4py calls after the gradients") == 3  # torch mlp and convnet, TF mlp
    # this machine's kernel reports steal, so every benchmark gets a percentage
    assert re.search(r"CPU steal .*: \d+% over the run \(allreduce \d+%, ", summary), summary
    assert not list(tmp_path.glob("*.tmp")), "temporary outputs left behind"


def test_a_failing_benchmark_does_not_stop_the_others(tmp_path: Path) -> None:
    # An invalid setting makes hvd.init() raise in allreduce.py; coordinator_scale.py does not read it.
    env = {**os.environ, "UNISON_FUSION_THRESHOLD": "bogus"}
    done = run_all(tmp_path, "--only", "allreduce,coordinator_scale", env=env)
    assert done.returncode != 0
    assert "benchmarks failed: allreduce" in done.stderr
    assert json.loads((tmp_path / "coordinator_scale.json").read_text())["cases"]
    assert (tmp_path / "coordinator_scale.png").read_bytes()[:8] == PNG_SIGNATURE
    assert not (tmp_path / "allreduce.json").exists() and not (tmp_path / "allreduce.png").exists()
    assert "Failed: allreduce." in (tmp_path / "summary.md").read_text()


def test_only_rejects_an_unknown_benchmark(tmp_path: Path) -> None:
    done = run_all(tmp_path, "--only", "allreduce,multihost")
    assert done.returncode == 2
    assert "--only names benchmarks ['multihost'] that do not exist" in done.stderr


def test_steal_share_is_the_stolen_part_of_the_cpu_time_between_two_readings() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from machine import cpu_times, percent, steal_share
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert steal_share((1000, 10), (1200, 60)) == 0.25
    assert steal_share((1000, 10), (1000, 10)) is None  # no time passed
    assert steal_share(None, (1000, 10)) is None
    assert (percent(0.25), percent(None)) == ("25%", "unknown")
    before = cpu_times()
    assert before is not None and before[0] > 0 and 0 <= before[1] <= before[0]
    sum(i * i for i in range(200_000))  # let some ticks pass
    after = cpu_times()
    assert after is not None and after[0] >= before[0] and after[1] >= before[1]


def test_revisions_compares_each_benchmarks_own_ratios() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import revisions
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    allreduce = {"cases": [{"case": "allreduce", "bytes": 4096, "raw": 1e-5, "unison": 2e-4},
                           {"case": "chunk_sweep_64MiB", "chunk_0": 0.03}]}  # a sweep has no raw side
    assert revisions.allreduce_ratios(allreduce) == {"allreduce allreduce 4096 B, unison/raw time": 20.0}
    train = {"models": {"mlp": {"unison_over_ddp": 1.4, "unison_over_mpi": 0.9}}}
    assert revisions.train_torch_ratios(train) == {"train_torch mlp, unison/ddp samples/s": 1.4,
                                                   "train_torch mlp, unison/mpi samples/s": 0.9}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "revisions.py"), "--before", "HEAD",
                           "--benchmarks", "allreduce,nope"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "unknown benchmarks ['nope']" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "revisions.py"), "--before", "no-such-revision"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "'no-such-revision' names no commit" in done.stderr, done.stderr


def test_the_gpu_benchmark_checks_its_training_measurements_on_the_cpu() -> None:
    """Where there is no GPU the benchmark's optimizer and latency parts run on the CPU, so they cannot rot."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--rounds", "2",
                           "--steps", "2", "--repeats", "10"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"DistributedOptimizer on cpu \(.*160 parameter tensors\): [\d.]+ ms per step against "
                     r"[\d.]+ ms plain \([+-][\d.]+%\)", done.stdout), done.stdout
    assert re.search(r"allreduce of 4 KiB at 1 rank: \d+ us on cpu, \d+ us on the CPU", done.stdout), done.stdout


def test_the_gpu_route_benchmark_runs_on_a_fake_device(tmp_path: Path) -> None:
    out = tmp_path / "gpu_route.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_route.py"), "--tensors", "8", "--steps", "4",
                           "--output", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["plane_mpi_direct_responses"] > 0  # the GPU route was taken end to end
    assert results["gpu_step_ms"] > 0 and results["host_step_ms"] > 0


def test_latency_binds_each_rank_to_a_core_and_counts_rounds_that_shared_one(tmp_path: Path) -> None:
    """Two ranks bound to two cores never share one; placed by the OS, the rounds that did are counted."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    for extra, name in (((), "bound.json"), (("--no-bind",), "placed.json")):
        done = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(ROOT / "benchmarks" / "latency.py"),
                               "--no-torch", "--calls", "120", "--rounds", "2", "--output", str(tmp_path / name),
                               *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    bound = json.loads((tmp_path / "bound.json").read_text())
    placed = json.loads((tmp_path / "placed.json").read_text())
    assert sorted(bound["bound_to_cores"]) == sorted(os.sched_getaffinity(0))[:2]
    assert placed["bound_to_cores"] == [None, None]
    for results in (bound, placed):
        assert {"hvd.allreduce 4 KiB", "mpi4py Allreduce 64 KiB", "Python loop, no communication"} <= results["sides"].keys()
        for side in results["sides"].values():
            assert 0 <= side["rounds_sharing_a_core"] <= 2 and len(side["round_p50_us"]) == 2
    assert all(side["rounds_sharing_a_core"] == 0 for side in bound["sides"].values())


def test_bind_to_core_pins_the_threads_there_are_and_those_started_later() -> None:
    code = ("import os, sys, threading; sys.path.insert(0, sys.argv[1]); from machine import bind_to_core, "
            "current_core\nseen, go = [], threading.Event()\n"
            "def look(): go.wait(); seen.append(sorted(os.sched_getaffinity(0)))\n"
            "before = threading.Thread(target=look); before.start()\n"
            "core = bind_to_core(1); go.set(); before.join(); after = threading.Thread(target=look); after.start()\n"
            "after.join(); print(core, current_core(), *seen, sorted(os.sched_getaffinity(0)), bind_to_core(4096))")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    second = sorted(os.sched_getaffinity(0))[1] if len(os.sched_getaffinity(0)) > 1 else None
    if second is None:
        assert done.stdout.split()[0] == "None"
        return
    assert done.stdout.split() == [str(second), str(second), *[f"[{second}]"] * 3, "None"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from machine import shared_a_core
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert shared_a_core([[0, 0, 1], [1, 1, 1]]) and not shared_a_core([[0, 1], [1, 0]])
    assert not shared_a_core([[None, None], [None, None]])  # no reading: no verdict
