"""init() in processes that torch's launchers started: never a silent job of one process each.

torchrun (and the tools that set torch's env:// variables) starts N processes without MPI; before,
each `hvd.init()` made a job of size 1 that trained alone on all the data and exited 0.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = "import unison as hvd; hvd.init(); print(f'rank {hvd.rank()} of {hvd.size()}', flush=True); hvd.shutdown()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "HYDRA_", "UNISON_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


@pytest.mark.timeout(180)
def test_torchrun_with_two_processes_is_refused_on_each(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(script)],
        capture_output=True, text=True, timeout=150, cwd=tmp_path, env=_clean_env())
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "rank 0 of 1" not in output, output  # no process went on to train alone
    # Each process refuses, unless torchrun already stopped it (SIGTERM) because the other one failed
    # first: on a loaded machine the second may not have reached init() by then.
    refused = [rank for rank in (0, 1) if (f"This process was started by torchrun as rank {rank} of "
                                           "WORLD_SIZE=2, but unison's job has only this process") in output]
    assert refused, output
    for rank in {0, 1} - set(refused):
        assert re.search(rf"rank +: {rank} \(local_rank: {rank}\)\s+exitcode +: -15", output), output
    assert "unisonrun -np 2 python <script>" in output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", ["1", "3"])
def test_torchs_variables_without_torchrun(world: str) -> None:
    """Any launcher of torch's env:// variables: WORLD_SIZE over 1 is refused, 1 is a job of one."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=100,
                          env=_clean_env(RANK="2", WORLD_SIZE=world, LOCAL_RANK="0"))
    if world == "1":
        assert done.returncode == 0 and "rank 0 of 1" in done.stdout, done.stderr
    else:
        assert done.returncode != 0
        assert ("ConfigError: This process was started by a launcher of torch's env:// variables as rank 2 of "
                "WORLD_SIZE=3") in done.stderr, done.stderr
