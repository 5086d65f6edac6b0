"""shutdown() right after a commit waits for the host check every rank started there, so no rank is left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._harness import HOSTS

pytestmark = pytest.mark.timeout(120)

# Commits outside hvd.elastic.run; rank 1 reaches its last commit a second after rank 0, which
# shuts down at once: rank 1's last check must still find rank 0's broadcast.
PROGRAM = """\
import time
import unison.torch as hvd
hvd.init()
state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, n=0)
for i in range(3):
    if hvd.rank() == 1 and i == 2:
        time.sleep(1.0)
    state.n += 1
    state.commit()
rank = hvd.rank()
hvd.shutdown()
print(f"rank {rank} done at n={state.n}", flush=True)
"""


def test_shutdown_after_a_commit_leaves_no_rank_behind(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text(f"{HOSTS[0]}:2\n")
    (tmp_path / "program.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    done = subprocess.run([sys.executable, "-m", "unison.launcher", "-np", "2", "--min-np", "2",
                           "--host-discovery-script", f"cat {tmp_path / 'hosts'}", sys.executable,
                           str(tmp_path / "program.py")], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr
    # The ranks' lines may reach mpiexec's output interleaved: find them anywhere.
    assert sorted(re.findall(r"rank (\d) done at n=(\d)", done.stdout)) == [("0", "3"), ("1", "3")], done.stdout
