"""`unisonrun -np 2 --pservers 2`: servers run the same script and stop in init(); trainers get ids 0 and 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, sys
import numpy as np
import unison.ps as ps
# servers run this too; one write per line: print writes the newline apart, and under PYTHONUNBUFFERED
# two servers sharing the launcher's stderr can then interleave their halves
sys.stderr.write(f"SEEN {os.environ.get('UNISON_PS_ROLE', '?')} {os.environ.get('MY_FLAG', '(unset)')} "
                 f"{os.environ.get('UNISON_LOG_LEVEL', '(unset)')}\\n")
client = ps.init()
ps.declare_dense({"w": np.zeros(3, np.float32)}, ps.SGD(1.0))
for _ in range(3):
    ps.pull_dense()
    ps.push(dense={"w": np.ones(3)})
sys.stdout.write(f"trainer {client.trainer} of {client.num_trainers} with {client.num_servers} servers\\n")
sys.stdout.flush()
ps.shutdown()
"""


@pytest.mark.timeout(90)
def test_unisonrun_starts_servers_and_trainers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    # a setting given with -x counts for the launcher's servers as for the trainers (one secret for all)
    done = subprocess.run([sys.executable, "-m", "unison.launcher", "-np", "2", "--pservers", "2", "-x",
                           "MY_FLAG=a b 'c'", "-x", f"UNISON_SECRET={'k' * 64}", "--log-level", "INFO",
                           sys.executable, str(script)],
                          capture_output=True, text=True, timeout=80, env=env)
    assert done.returncode == 0, done.stderr
    # -x pairs and --log-level reach the servers as they reach the trainers
    seen = sorted(line for line in done.stderr.splitlines() if line.startswith("SEEN"))
    assert seen == ["SEEN server a b 'c' info"] * 2 + ["SEEN trainer a b 'c' info"] * 2, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("trainer")) == [
        "trainer 0 of 2 with 2 servers", "trainer 1 of 2 with 2 servers"]
    assert "returned on a server" not in done.stderr
