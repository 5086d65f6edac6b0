"""The elastic example survives the rank it kills and trains on to a useful accuracy."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.long_jobs

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(120)
def test_pytorch_elastic_digits_goes_on_after_losing_a_rank(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"localhost:1\n127.0.0.1:1\n{socket.gethostname()}:1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    done = subprocess.run([str(Path(sys.executable).parent / "unisonrun"), "-np", "2", "--min-np", "1",
                           "--max-np", "3", "--host-discovery-script", f"cat {hosts}", sys.executable,
                           "examples/pytorch_elastic_digits.py", "--epochs", "3", "--kill-at", "10"],
                          capture_output=True, text=True, timeout=110, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "epoch 0 failed" in done.stderr and "blacklisting 127.0.0.1" in done.stderr, done.stderr
    assert "epoch 1: 2 ranks on" in done.stderr, done.stderr
    epochs = re.findall(r"^epoch (\d): accuracy ([\d.]+) on 2 ranks", done.stdout, re.MULTILINE)
    assert [int(e) for e, _ in epochs] == [0, 1, 2], done.stdout
    assert float(epochs[-1][1]) > 0.9, done.stdout
