"""Run a job as a subprocess with a deadline, and check that none of its ranks is left running."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
HERE = Path(__file__).resolve().parent
SCENARIO = str(HERE / "_scenario.py")
BOUND_SECONDS = 10.0  # what the issue promises
DEADLINE_SECONDS = 40.0  # the hang guard of the subprocess itself


@dataclasses.dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


def unisonrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "unison.launcher", *args]


def run_job(cmd: Sequence[str], env: dict[str, str] | None = None,
            deadline: float = DEADLINE_SECONDS) -> Finished:
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        raise AssertionError(f"job still running after {deadline} s (hang):\n{out[-3000:]}") from None
    return Finished(proc.returncode, out, time.monotonic() - start)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by its (dead) parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def assert_no_strays(pid_dir: Path, expected: int) -> None:
    pids = [int(p.read_text()) for p in sorted(pid_dir.glob("pid-*"))]
    assert len(pids) == expected, f"only {len(pids)} of {expected} ranks started"
    deadline = time.monotonic() + 2.0  # the last rank may still be inside its exit
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"processes of the job left running: {left}"
