"""Elastic training costs: recovery after a kill, commit cost, steady-state step time, scale-up time.

Run: ``python benchmarks/elastic.py [--quick] [--out FILE]`` (writes ``benchmarks/results/elastic.json``).

* recovery: 2 hosts x 1 slot (``localhost`` and ``127.0.0.1``, two names of this machine), an
  11.5 M-parameter MLP with SGD momentum, a commit every step; rank 1 SIGKILLs itself; the time from
  the kill to the first step completed after the relaunch, split into its phases (the old launch
  ending, the new processes starting and importing, ``init()``, restoring the commit, the step).
  ``recovery_raise``: the same, rank 1 raising an exception instead.
* commit: ``state.commit()`` of that model and optimizer into the shared-memory store, against a
  memory copy of the same tensors (``clone``), in one process; medians.
* steady state: 2 ranks, median step time without elastic (plain unisonrun, no state) and under the
  elastic driver with a commit every step.
* scale-up: from the discovery script offering a second host to the first step completed on 2 ranks.

``--emulated`` runs recovery, steady state and scale-up across 2 emulated hosts instead
(`unison.testing.hosts`: network namespaces joined by veth links, MPI over TCP between them, each host
its own store writer; needs root), recorded under ``emulated_hosts`` in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
UNISONRUN = [PYTHON, "-m", "unison.launcher"]


@dataclasses.dataclass(frozen=True)
class Place:
    """Where the 2-host runs happen: two host names, unisonrun's extra options, and how to start it."""

    hosts: tuple[str, str]
    args: tuple[str, ...] = ()
    wrap: Callable[[list[str]], list[str]] = list


LOCAL = Place(("localhost", "127.0.0.1"))  # two names of this machine: two hosts to the driver


@contextlib.contextmanager
def emulated() -> Iterator[Place]:
    """2 emulated hosts (h0, h1), unisonrun started in h0."""
    sys.path.insert(0, str(HERE.parent))
    from unison.testing.hosts import EmulatedHosts, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"--emulated needs emulated hosts: {reason}")
    with EmulatedHosts(hosts=2, slots=1) as cluster:
        yield Place(("h0", "h1"), ("--launcher-exec", cluster.launcher_exec, "--iface", "eth0"),
                    lambda cmd: cluster.exec_command(0, cmd))


def mlp() -> Any:
    import torch

    # 1024*2048 + 2*2048*2048 + 2048*512 weights plus biases: 11,540,992 parameters.
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 512))


def worker(mode: str, out: Path, steps: int) -> None:
    """One rank: train `steps` steps, logging when each ends (``mode``: plain, elastic)."""
    started = time.time()
    import torch

    import unison.torch as hvd

    imported = time.time()
    hvd.init()
    initialized = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    data, target = torch.randn(32, 1024), torch.randn(32, 512)
    epoch = int(os.environ.get("UNISON_ELASTIC_EPOCH", "0"))
    log = out / f"log-{epoch}-{hvd.rank()}.json"
    record: dict[str, Any] = {"started": started, "imported": imported, "initialized": initialized,
                              "size": hvd.size(), "steps": []}

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()

    if mode == "plain":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for _ in range(steps):
            step()
            record["steps"].append(time.time())
        log.write_text(json.dumps(record))
        return
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    kill_at = int(os.environ.get("BENCH_KILL_AT", "-1"))
    live = os.environ.get("BENCH_LIVE_LOG") == "1"

    @hvd.elastic.run
    def train(state: Any) -> None:
        record["restored"] = time.time()
        while state.step < steps:
            if state.step == kill_at and hvd.rank() == 1 and epoch == 0:
                (out / "killed").write_text(str(time.time()))
                if os.environ.get("BENCH_FAIL") == "raise":
                    raise RuntimeError("the benchmark's failure")
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            state.step += 1
            state.commit()
            record["steps"].append(time.time())
            if live:  # recovery and scale-up read these as the job runs; the steady state writes at the end
                log.write_text(json.dumps(record))
                if hvd.rank() == 0:  # read while the job runs: whole or not at all
                    (out / "progress.tmp").write_text(f"{state.step} {hvd.size()}")
                    os.replace(out / "progress.tmp", out / "progress")

    train(state)
    log.write_text(json.dumps(record))


def _discovery(out: Path, hosts: list[str]) -> str:
    path = out / "hosts"
    tmp = out / "hosts.tmp"
    tmp.write_text("".join(f"{h}\n" if ":" in h else f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)
    return f"cat {path}"


def _elastic(place: Place, out: Path, np: int, steps: int, env: dict[str, str],
             min_np: int = 1) -> subprocess.Popen[str]:
    cmd = [*UNISONRUN, "-np", str(np), "--min-np", str(min_np), "--max-np", "2", *place.args,
           "--host-discovery-script", f"cat {out / 'hosts'}", "--discovery-interval", "0.2",
           PYTHON, __file__, "--worker", "elastic", "--dir", str(out), "--steps", str(steps)]
    return subprocess.Popen(place.wrap(cmd), env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _logs(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    logs = {}
    for path in out.glob("log-*.json"):
        _, epoch, rank = path.stem.split("-")
        logs[(int(epoch), int(rank))] = json.loads(path.read_text())
    return logs


def recovery(place: Place, steps: int, how: str = "kill") -> dict[str, float]:
    """Recovery after rank 1 fails `how` (``kill``: SIGKILL; ``raise``: an uncaught exception)."""
    with tempfile.TemporaryDirectory() as name:
        out = Path(name)
        _discovery(out, list(place.hosts))
        proc = _elastic(place, out, 2, steps, {"BENCH_KILL_AT": "5", "BENCH_LIVE_LOG": "1", "BENCH_FAIL": how})
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or not (out / "killed").exists():
            raise RuntimeError(f"the recovery run failed (exit status {proc.returncode}):\n{err}")
        killed = float((out / "killed").read_text())
        logs = _logs(out)
        after = logs[(1, 0)]
        before = logs[(0, 0)]
        return {"kill_to_first_step_s": after["steps"][0] - killed,
                "kill_to_new_processes_started_s": after["started"] - killed,
                "imports_s": after["imported"] - after["started"],
                "init_s": after["initialized"] - after["imported"],
                "model_and_restore_s": after["restored"] - after["initialized"],
                "first_step_s": after["steps"][0] - after["restored"],
                "step_before_s": statistics.median(b - a for a, b in zip(before["steps"], before["steps"][1:])),
                "size_after": after["size"]}


def _steady_once(place: Place, label: str, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as name:
        out = Path(name)
        if label == "plain":
            hosts = ["-H", ",".join(f"{h}:1" for h in place.hosts)] if place.args else []
            cmd = [*UNISONRUN, "-np", "2", *hosts, *place.args, PYTHON, __file__, "--worker", "plain",
                   "--dir", str(out), "--steps", str(steps)]
            done = subprocess.run(place.wrap(cmd), capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
        else:
            # Two hosts (two writers), or one host with 2 slots (one writer).
            _discovery(out, list(place.hosts) if label.endswith("2_hosts") else [f"{place.hosts[0]}:2"])
            proc = _elastic(place, out, 2, steps, {}, min_np=2)
            _, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(err)
        stamps: list[float] = _logs(out)[(0, 0)]["steps"]
        return stamps


def steady(place: Place, steps: int, repeats: int) -> dict[str, Any]:
    """Median step time of each configuration, `repeats` runs each, alternated (the machine is shared)."""
    labels: tuple[str, ...] = ("plain", "commit_every_step_2_hosts", "commit_every_step_1_host")
    if place is not LOCAL:  # plain runs across both hosts: only the 2-host configuration compares with it
        labels = labels[:2]
    medians: dict[str, list[float]] = {label: [] for label in labels}
    skip = min(3, steps // 4)
    for _ in range(repeats):
        for label in labels:
            stamps = _steady_once(place, label, steps)
            medians[label].append(statistics.median(b - a for a, b in zip(stamps[skip:], stamps[skip + 1:])))
    result: dict[str, Any] = {f"{label}_step_s": values for label, values in medians.items()}
    for label in labels[1:]:
        result[f"{label}_ratio_per_run"] = [m / p for m, p in zip(medians[label], medians["plain"])]
        result[f"{label}_ratio_best"] = min(medians[label]) / min(medians["plain"])
    return result


def scale_up(place: Place, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        out = Path(name)
        _discovery(out, [place.hosts[0]])
        proc = _elastic(place, out, 1, steps, {"BENCH_LIVE_LOG": "1"})
        offered = 0.0
        while proc.poll() is None:
            progress = out / "progress"
            if not offered and progress.exists() and int(progress.read_text().split()[0]) >= 4:
                _discovery(out, list(place.hosts))
                offered = time.time()
            time.sleep(0.02)
        if proc.returncode != 0 or not offered:
            raise RuntimeError(f"the scale-up run failed:\n{proc.communicate()[1]}")
        grown = _logs(out)[(1, 0)]
        return {"offered_to_first_step_on_2_s": grown["steps"][0] - offered, "size_after": grown["size"]}


def commit_cost(repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as store:
        code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import elastic; elastic.measure_commit({repeats})")
        env = {**os.environ, "UNISON_ELASTIC_STORE": store, "UNISON_ELASTIC_HOSTS": "localhost:1"}
        done = subprocess.run([*UNISONRUN, "-np", "1", PYTHON, "-c", code], capture_output=True, text=True,
                              env=env, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def measure_commit(repeats: int) -> None:
    """In one rank: median time of state.commit() and of cloning the same tensors."""
    import torch

    import unison.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.nn.functional.mse_loss(model(torch.randn(8, 1024)), torch.randn(8, 512)).backward()
    optimizer.step()
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    tensors = list(model.state_dict().values()) + [s["momentum_buffer"] for s in optimizer.state.values()]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    commits, blocking, copies = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        copied = [t.clone() for t in tensors]
        copies.append(time.perf_counter() - start)
        del copied
        start = time.perf_counter()
        state.commit()
        blocking.append(time.perf_counter() - start)
        state.finish_commit()  # the write into shared memory, which otherwise overlaps the next step
        commits.append(time.perf_counter() - start)
    commit, copy = statistics.median(commits), statistics.median(copies)
    print(json.dumps({"state_bytes": nbytes, "commit_s": commit, "commit_blocking_s": statistics.median(blocking),
                      "memory_copy_s": copy, "ratio": commit / copy}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results" / "elastic.json"))
    parser.add_argument("--only", default="recovery,recovery_raise,commit,steady,scale_up")
    parser.add_argument("--emulated", action="store_true", help="also run recovery, steady and scale-up "
                        "across 2 emulated hosts (root)")
    parser.add_argument("--worker", default="")
    parser.add_argument("--dir", default="")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, Path(args.dir), args.steps)
        return
    steps = 10 if args.quick else 20
    result: dict[str, Any] = {"load_average_before": os.getloadavg()}
    repeats = 1 if args.quick else 3
    runs: dict[str, Callable[[Place], Any]] = {
        "recovery": lambda place: recovery(place, steps),
        "recovery_raise": lambda place: recovery(place, steps, "raise"),
        "commit": lambda place: commit_cost(3 if args.quick else 10),
        "steady": lambda place: steady(place, 2 * steps, repeats),
        "scale_up": lambda place: scale_up(place, steps)}
    for name in args.only.split(","):
        result[name] = runs[name](LOCAL)
        print(name, json.dumps(result[name]), flush=True)
    if args.emulated:
        result["emulated_hosts"] = {}
        with emulated() as place:
            for name in args.only.split(","):
                if name != "commit":  # one process: no hosts involved
                    result["emulated_hosts"][name] = runs[name](place)
                    print("emulated hosts:", name, json.dumps(result["emulated_hosts"][name]), flush=True)
    result["load_average_after"] = os.getloadavg()
    print("load average before", result["load_average_before"], "after", result["load_average_after"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
