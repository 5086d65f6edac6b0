"""init() in processes that torch's launchers started: never a silent job of one process each.

torchrun (and the tools that set torch's env:// variables) starts N processes without MPI; once, each
`hvd.init()` made a job of size 1 that trained alone on all the data and exited 0. Now they make one job
through torch's store (tests/torchrun has the rest), and without a store to meet through they refuse.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
SCRIPT = "import unison as hvd; hvd.init(); print(f'rank {hvd.rank()} of {hvd.size()}', flush=True); hvd.shutdown()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "HYDRA_", "UNISON_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


@pytest.mark.timeout(180)
def test_torchrun_with_two_processes_makes_one_job_of_two(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(script)],
        capture_output=True, text=True, timeout=150, cwd=tmp_path, env=_clean_env())
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "rank 0 of 2" in output and "rank 1 of 2" in output, output
    assert "rank 0 of 1" not in output, output  # no process went on to train alone


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", ["1", "3"])
def test_torchs_variables_without_torchrun(world: str) -> None:
    """torch's env:// variables without MASTER_ADDR and MASTER_PORT (nothing to meet through): WORLD_SIZE
    over 1 is refused, 1 is a job of one."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=100,
                          env=_clean_env(RANK="2", WORLD_SIZE=world, LOCAL_RANK="0"))
    if world == "1":
        assert done.returncode == 0 and "rank 0 of 1" in done.stdout, done.stderr
    else:
        assert done.returncode != 0
        assert ("ConfigError: This process was started by a launcher of torch's env:// variables as rank 2 of "
                "WORLD_SIZE=3") in done.stderr, done.stderr
