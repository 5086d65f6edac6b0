"""Run an elastic job of tests/elastic/_train.py under unisonrun and check what it committed."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import _train

PYTHON = sys.executable
TRAIN = str(Path(__file__).with_name("_train.py"))
# Distinct names of this machine: to the driver they are hosts (blacklisted, added, removed one by
# one); Hydra starts all of them locally.
HOSTS = ("localhost", "127.0.0.1", socket.gethostname())


@dataclasses.dataclass
class Job:
    returncode: int
    stderr: str
    results: list[dict[str, object]]
    seconds: float


def _write_hosts(path: Path, hosts: Sequence[str]) -> None:
    """Replace the discovery output atomically (the driver may run `cat` at any moment)."""
    text = "".join(f"{h}\n" for h in hosts)
    if path.exists() and path.read_text() == text:
        return
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def run(tmp_path: Path, hosts: Sequence[str], args: Sequence[str], env: dict[str, str] | None = None,
        schedule: Callable[[int, int], Sequence[str] | None] | None = None, timeout: float = 90,
        wrap: Callable[[list[str]], list[str]] = list, program: str = TRAIN, discover: bool = True,
        on_line: Callable[[str], None] | None = None) -> Job:
    """Start the job with `hosts` discovered; `schedule(commits, size)` may return new hosts as it runs.

    `wrap` turns unisonrun's command line into the one to run (e.g. inside an emulated host). Without
    `discover` there is no discovery script: `args` name the hosts (-H, an elastic job on fixed hosts).
    `on_line` is called with each line unisonrun writes to stderr, as it comes (faults sent from outside).
    """
    hosts_file = tmp_path / "hosts"
    _write_hosts(hosts_file, hosts)
    run_env = dict(os.environ, ELASTIC_OUT=str(tmp_path), **(env or {}))
    discovery = ["--host-discovery-script", f"cat {hosts_file}", "--slots-per-host", "1"] if discover else []
    cmd = [PYTHON, "-m", "unison.launcher", *args, *discovery, "--discovery-interval", "0.2", PYTHON, program]
    start = time.monotonic()
    proc = subprocess.Popen(wrap(cmd), env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = None
    if on_line is not None:  # read stderr as it comes
        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                on_line(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the elastic job ran past {timeout} s")
            progress = tmp_path / "progress"
            if schedule is not None and progress.exists():
                words = progress.read_text().split()
                if len(words) == 2:
                    new = schedule(int(words[0]), int(words[1]))
                    if new is not None:
                        _write_hosts(hosts_file, new)
            time.sleep(0.05)
        if reader is not None:
            proc.wait(timeout=30)
            reader.join(30)
            stderr = "".join(lines)
        else:
            _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-*.json"))]
    return Job(proc.returncode, stderr, results, time.monotonic() - start)


def check_committed(job: Job, samples: int, epochs: int, size: int) -> None:
    """Every rank of the last launch holds the same state, which replaying its history reproduces bit
    for bit, and that history holds every sample exactly once per epoch."""
    assert job.returncode == 0, job.stderr
    results = job.results
    assert sorted(r["rank"] for r in results) == list(range(size)), job.stderr
    assert {r["size"] for r in results} == {size}
    assert len({json.dumps([r["history"], r["weight"], r["momentum"], r["commits"]]) for r in results}) == 1
    history = results[0]["history"]
    assert isinstance(history, list)
    assert _train.replay(history) == (results[0]["weight"], results[0]["momentum"])
    check_each_sample_once(history, samples, epochs)


def check_each_sample_once(history: Sequence[tuple[int, Sequence[int]]], samples: int, epochs: int) -> None:
    """`history` ((epoch, sample indices) per committed step) holds every sample exactly once per epoch."""
    per_epoch = collections.defaultdict(list)
    for epoch, indices in history:
        per_epoch[epoch] += indices
    assert sorted(per_epoch) == list(range(epochs))
    for epoch, indices in per_epoch.items():
        assert sorted(indices) == list(range(samples)), f"epoch {epoch}: {sorted(indices)}"
