"""Rank 0 logs the gRPC service's address at INFO, through unison's own log handler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
PROGRAM = "import unison as hvd; hvd.init(); hvd.shutdown()"


@pytest.mark.timeout(120)
def test_rank_0_logs_the_service_address_at_info() -> None:
    env = {**os.environ, "UNISON_CONTROLLER": "grpc", "UNISON_LOG_LEVEL": "info"}
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "coordinator service listening on" in line]
    assert len(lines) == 1, done.stderr
    assert "[unison rank 0/2 " in lines[0] and " INFO coordinator service listening on 127.0.0.1:" in lines[0]
