"""Start parameter servers and trainers as real processes, in the explicit form (UNISON_PS_* variables)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

SECRET = "t" * 64
HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(endpoints: list[str], num_trainers: int, mode: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    env.update(UNISON_SECRET=SECRET, UNISON_PS_ENDPOINTS=",".join(endpoints),
               UNISON_PS_NUM_TRAINERS=str(num_trainers), UNISON_PS_MODE=mode, PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def start_server(index: int, endpoints: list[str], num_trainers: int, mode: str, **extra: str) -> subprocess.Popen:
    env = environment(endpoints, num_trainers, mode, UNISON_PS_ROLE="server", UNISON_PS_SERVER_INDEX=str(index),
                      **extra)
    return subprocess.Popen([sys.executable, str(HERE / "_server.py")], env=env, cwd=ROOT)


def start_trainer(trainer: int, endpoints: list[str], num_trainers: int, mode: str, scenario: str, out: Path,
                  **extra: str) -> subprocess.Popen:
    env = environment(endpoints, num_trainers, mode, UNISON_PS_ROLE="trainer", UNISON_PS_TRAINER_ID=str(trainer),
                      **extra)
    return subprocess.Popen([sys.executable, str(HERE / "_trainer.py"), scenario, str(out)], env=env, cwd=ROOT)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    return [p.wait(timeout) for p in procs]


def run_job(tmp_path: Path, scenario: str, mode: str, trainers: int, servers: int, timeout: float,
            suffix: str = "npz", **extra: str) -> list[Path]:
    """Run `servers` servers and `trainers` trainers of `scenario` to a clean end; the trainers' outputs."""
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(servers)]
    procs = [start_server(i, endpoints, trainers, mode) for i in range(servers)]
    outs = [tmp_path / f"t{t}.{suffix}" for t in range(trainers)]
    workers = [start_trainer(t, endpoints, trainers, mode, scenario, outs[t], **extra) for t in range(trainers)]
    try:
        assert wait_all(workers, timeout) == [0] * trainers
        assert wait_all(procs, 20) == [0] * servers
    finally:
        stop(*workers, *procs)
    return outs
