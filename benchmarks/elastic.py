"""Elastic training costs: recovery after a kill, commit cost, steady-state step time, scale-up time.

Run: ``python benchmarks/elastic.py [--quick] [--out FILE]`` (writes ``benchmarks/results/elastic.json``).

* recovery: 2 hosts x 1 slot (``localhost`` and ``127.0.0.1``, two names of this machine), an
  11.5 M-parameter MLP with SGD momentum, a commit every step, ``--min-np 1``; rank 1 SIGKILLs itself
  (``recovery_raise``: raises an exception) at step 5; the time from the kill to the job's first
  commit after it, and how many processes the job started in all. Measured side by side, alternated,
  with the survivors keeping their processes (the default) and with ``--elastic-relaunch`` (one
  mpiexec launch per epoch); each run records the load average. The relaunch runs also split their
  recovery into phases (the new processes starting and importing, ``init()``, restoring the commit,
  the step).
* commit: ``state.commit()`` of that model and optimizer into the shared-memory store, against a
  memory copy of the same tensors (``clone``), in one process; medians.
* steady state: 2 ranks, median step time without elastic (plain unisonrun, no state) and under the
  elastic driver with a commit every step: the survivors' kind (gloo) on two hosts and on one host
  of 2 slots, and the relaunching kind (MPI) on two hosts.
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
_KILL_AT = 5  # recovery: rank 1 fails after this many committed steps


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
    """One rank: train `steps` steps, logging when each ends (``mode``: plain, elastic).

    Each process writes ``log-<pid>.json``: when it started, imported, initialized, the epoch it
    started in, and each step's end time and job size; with ``BENCH_LIVE_LOG=1`` after every step.
    """
    started = time.time()
    (out / f"started-{os.getpid()}").write_text(str(started))
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
    log = out / f"log-{os.getpid()}.json"
    record: dict[str, Any] = {"started": started, "imported": imported, "initialized": initialized,
                              "start_epoch": epoch, "rank": hvd.rank(), "restored": [], "steps": []}

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()

    if mode == "plain":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for number in range(1, steps + 1):
            step()
            record["steps"].append((time.time(), hvd.size(), number))
        _write(log, json.dumps(record))
        return
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    kill_at = int(os.environ.get("BENCH_KILL_AT", "-1"))
    live = os.environ.get("BENCH_LIVE_LOG") == "1"

    @hvd.elastic.run
    def train(state: Any) -> None:
        record["restored"].append(time.time())
        while state.step < steps:
            if state.step == kill_at and hvd.rank() == 1 and not (out / "killed").exists():
                (out / "killed").write_text(str(time.time()))
                if os.environ.get("BENCH_FAIL") == "raise":
                    raise RuntimeError("the benchmark's failure")
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            state.step += 1
            state.commit()
            record["steps"].append((time.time(), hvd.size(), state.step))
            record["rank"] = hvd.rank()
            if live:  # recovery and scale-up read these as the job runs; the steady state writes at the end
                _write(log, json.dumps(record))
                if hvd.rank() == 0:  # read while the job runs: whole or not at all
                    (out / "progress.tmp").write_text(f"{state.step} {hvd.size()}")
                    os.replace(out / "progress.tmp", out / "progress")

    train(state)
    _write(log, json.dumps(record))


def _write(path: Path, text: str) -> None:
    """Replace `path` whole (a process killed while it writes leaves the previous text)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _discovery(out: Path, hosts: list[str]) -> str:
    path = out / "hosts"
    tmp = out / "hosts.tmp"
    tmp.write_text("".join(f"{h}\n" if ":" in h else f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)
    return f"cat {path}"


def _elastic(place: Place, out: Path, np: int, steps: int, env: dict[str, str],
             min_np: int = 1, relaunch: bool = False) -> subprocess.Popen[str]:
    cmd = [*UNISONRUN, "-np", str(np), "--min-np", str(min_np), "--max-np", "2", *place.args,
           *(["--elastic-relaunch"] if relaunch else []),
           "--host-discovery-script", f"cat {out / 'hosts'}", "--discovery-interval", "0.2",
           PYTHON, __file__, "--worker", "elastic", "--dir", str(out), "--steps", str(steps)]
    return subprocess.Popen(place.wrap(cmd), env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _logs(out: Path) -> list[dict[str, Any]]:
    """Every process's log, in the order the processes started."""
    return sorted((json.loads(path.read_text()) for path in out.glob("log-*.json")), key=lambda r: r["started"])


def recovery(place: Place, steps: int, how: str = "kill", relaunch: bool = False) -> dict[str, float]:
    """Recovery after rank 1 fails `how` (``kill``: SIGKILL; ``raise``: an uncaught exception)."""
    with tempfile.TemporaryDirectory() as name:
        out = Path(name)
        _discovery(out, list(place.hosts))
        load = os.getloadavg()[0]
        proc = _elastic(place, out, 2, steps, {"BENCH_KILL_AT": str(_KILL_AT), "BENCH_LIVE_LOG": "1", "BENCH_FAIL": how},
                        relaunch=relaunch)
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or not (out / "killed").exists():
            raise RuntimeError(f"the recovery run failed (exit status {proc.returncode}):\n{err}")
        killed = float((out / "killed").read_text())
        logs = _logs(out)
        # The first commit after the kill: of the step the killed rank never took (an earlier step's
        # commit may still be on its way when the kill comes).
        after = [(t, size) for record in logs for t, size, number in record["steps"] if number > _KILL_AT]
        before = logs[0]["steps"][:_KILL_AT]
        result = {"kill_to_first_commit_s": min(after)[0] - killed,
                  "processes_started": len(list(out.glob("started-*"))),
                  "step_before_s": statistics.median(b[0] - a[0] for a, b in zip(before, before[1:])),
                  "size_after": max(after)[1], "load_average": load}
        if relaunch:
            new = logs[-1]  # the relaunched process
            result.update({"kill_to_new_process_started_s": new["started"] - killed,
                           "imports_s": new["imported"] - new["started"],
                           "init_s": new["initialized"] - new["imported"],
                           "model_and_restore_s": new["restored"][0] - new["initialized"],
                           "first_step_s": new["steps"][0][0] - new["restored"][0]})
        else:  # the process that stepped on after the kill, in its own process
            survivor = next(record for record in logs if any(n > _KILL_AT for _, _, n in record["steps"]))
            result["survivor_restored_after_kill_s"] = survivor["restored"][-1] - killed
        return result


def recoveries(place: Place, steps: int, how: str, repeats: int) -> dict[str, Any]:
    """`recovery` with the survivors kept and with every process relaunched, `repeats` times each,
    alternated (the machine is shared): every run's numbers and each side's medians."""
    runs: dict[str, list[dict[str, float]]] = {"in_place": [], "relaunch": []}
    for _ in range(repeats):
        for side in runs:
            runs[side].append(recovery(place, steps, how, relaunch=side == "relaunch"))
    result: dict[str, Any] = {"runs": runs}
    for side, results in runs.items():
        result[f"{side}_kill_to_first_commit_median_s"] = statistics.median(r["kill_to_first_commit_s"] for r in results)
        result[f"{side}_processes_started"] = sorted({int(r["processes_started"]) for r in results})
    return result


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
            _discovery(out, list(place.hosts) if "2_hosts" in label else [f"{place.hosts[0]}:2"])
            proc = _elastic(place, out, 2, steps, {}, min_np=2, relaunch=label.startswith("relaunch"))
            _, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(err)
        zero = next(record for record in _logs(out) if record["rank"] == 0)
        return [t for t, _, _ in zero["steps"]]


def steady(place: Place, steps: int, repeats: int) -> dict[str, Any]:
    """Median step time of each configuration, `repeats` runs each, alternated (the machine is shared)."""
    labels: tuple[str, ...] = ("plain", "commit_every_step_2_hosts", "relaunch_commit_every_step_2_hosts",
                               "commit_every_step_1_host")
    if place is not LOCAL:  # plain runs across both hosts: only the 2-host configurations compare with it
        labels = labels[:3]
    medians: dict[str, list[float]] = {label: [] for label in labels}
    skip = min(3, steps // 4)
    loads = []
    for _ in range(repeats):
        for label in labels:
            loads.append(os.getloadavg()[0])
            stamps = _steady_once(place, label, steps)
            medians[label].append(statistics.median(b - a for a, b in zip(stamps[skip:], stamps[skip + 1:])))
    result: dict[str, Any] = {f"{label}_step_s": values for label, values in medians.items()}
    for label in labels[1:]:
        result[f"{label}_ratio_per_run"] = [m / p for m, p in zip(medians[label], medians["plain"])]
        result[f"{label}_ratio_best"] = min(medians[label]) / min(medians["plain"])
    result["load_averages"] = loads
    return result


def scale_up(place: Place, steps: int, relaunch: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        out = Path(name)
        _discovery(out, [place.hosts[0]])
        proc = _elastic(place, out, 1, steps, {"BENCH_LIVE_LOG": "1"}, relaunch=relaunch)
        offered = 0.0
        while proc.poll() is None:
            progress = out / "progress"
            if not offered and progress.exists() and int(progress.read_text().split()[0]) >= 4:
                _discovery(out, list(place.hosts))
                offered = time.time()
            time.sleep(0.02)
        if proc.returncode != 0 or not offered:
            raise RuntimeError(f"the scale-up run failed:\n{proc.communicate()[1]}")
        grown = min(t for record in _logs(out) for t, size, _ in record["steps"] if size == 2)
        return {"offered_to_first_step_on_2_s": grown - offered, "processes_started": len(list(out.glob("started-*")))}


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
    parser.add_argument("--repeats", type=int, default=0, help="runs of each side (default 3, --quick 1)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, Path(args.dir), args.steps)
        return
    steps = 10 if args.quick else 20
    result: dict[str, Any] = {"load_average_before": os.getloadavg()}
    repeats = args.repeats or (1 if args.quick else 3)
    runs: dict[str, Callable[[Place], Any]] = {
        "recovery": lambda place: recoveries(place, steps, "kill", repeats),
        "recovery_raise": lambda place: recoveries(place, steps, "raise", repeats),
        "commit": lambda place: commit_cost(3 if args.quick else 10),
        "steady": lambda place: steady(place, 2 * steps, repeats),
        "scale_up": lambda place: {"in_place": scale_up(place, steps), "relaunch": scale_up(place, steps, True)}}
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
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The sections run now replace theirs; the others keep what an earlier run measured.
    kept = json.loads(out.read_text()) if out.exists() else {}
    if args.emulated:
        result["emulated_hosts"] = {**kept.get("emulated_hosts", {}), **result["emulated_hosts"]}
    out.write_text(json.dumps({**kept, **result}, indent=1))


if __name__ == "__main__":
    main()
