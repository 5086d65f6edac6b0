"""`unisonrun --pservers N`: start N parameter servers on this host running the job's own script, for its trainers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import LaunchError

__all__ = ["parameter_servers"]

_START_SECONDS = 60.0
_EXIT_SECONDS = 30.0


@contextlib.contextmanager
def parameter_servers(count: int, num_trainers: int, program: Sequence[str], mode: str = "") -> Iterator[dict[str, str]]:
    """Run `count` servers (the same `program`, whose ``unison.ps.init()`` serves), and yield the trainers' variables.

    Each server listens on a free port of this host and writes its address to a file; the trainers
    get every address, the number of trainers and the job secret (made here unless ``UNISON_SECRET``
    is set). On leaving, the servers get time to exit by themselves (they do once every trainer
    finished), then are terminated.
    """
    if count < 1:
        raise LaunchError(f"--pservers must be at least 1. Got --pservers {count}.")
    if not program:
        raise LaunchError("No program given: unisonrun -np N --pservers M python train.py")
    from ..service.security import new_secret

    secret = os.environ.get("UNISON_SECRET") or new_secret()
    common = {"UNISON_SECRET": secret, "UNISON_PS_NUM_TRAINERS": str(num_trainers),
              "UNISON_PS_NUM_SERVERS": str(count), **({"UNISON_PS_MODE": mode} if mode else {})}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="unisonrun-ps-") as directory:
        files = [Path(directory) / f"server-{i}.address" for i in range(count)]
        try:
            for i, file in enumerate(files):
                env = dict(os.environ, **common, UNISON_PS_ROLE="server", UNISON_PS_SERVER_INDEX=str(i),
                           UNISON_PS_ADDRESS_FILE=str(file))
                procs.append(subprocess.Popen(list(program), env=env))
            deadline = time.monotonic() + _START_SECONDS
            while not all(f.exists() for f in files):
                for i, p in enumerate(procs):
                    if p.poll() is not None:
                        raise LaunchError(f"parameter server {i} (pid {p.pid}) exited with status {p.returncode} "
                                          "before it listened; its output above says why.")
                if time.monotonic() > deadline:
                    raise LaunchError(f"the parameter servers did not listen within {_START_SECONDS:.0f} s.")
                time.sleep(0.05)
            endpoints = ",".join(f.read_text().strip() for f in files)
            yield {**common, "UNISON_PS_ROLE": "trainer", "UNISON_PS_ENDPOINTS": endpoints}
        finally:
            deadline = time.monotonic() + _EXIT_SECONDS
            for p in procs:
                try:
                    p.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(5.0)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
