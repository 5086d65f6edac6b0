"""The unison backend under the frameworks' own launchers (real processes): Lightning's (``python train.py``
with ``devices=2``), Lightning under SLURM's variables (each process a task of the step, as srun starts
them), and Accelerate (its CPU recipe: the processes started by torchrun). Each trains to the parameters
the same run on gloo gives, on every rank; a desync is named on every rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import HERE, ROOT, clean_env, errors, free_port, outcome, run

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(300)]

LIGHTNING = str(HERE / "_lightning.py")
ACCELERATE = str(HERE / "_accelerate.py")
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _same(results: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    assert [(r["rank"], r["size"], r["backend"]) for r in results] == [(0, 2, "unison"), (1, 2, "unison")]
    assert results[0]["params"] == results[1]["params"] == reference[0]["params"]


def _desync_named(out: Path, output: str) -> None:
    for text in errors(out):
        assert "MismatchError: Mismatched " in text, (text, output[-3000:])


@pytest.fixture(scope="module")
def lightning_on_gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("pytorch_lightning")
    out = tmp_path_factory.mktemp("lightning-gloo")
    done = run([LIGHTNING, str(out), "gloo"], clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return outcome(out)


def test_lightnings_own_launcher(tmp_path: Path, lightning_on_gloo: list[dict[str, Any]]) -> None:
    done = run([LIGHTNING, str(tmp_path), "unison"], clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    _same(outcome(tmp_path), lightning_on_gloo)


def test_a_desync_under_lightnings_launcher_is_named_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    done = run([LIGHTNING, str(tmp_path), "unison", "desync"], clean_env())
    assert done.returncode != 0
    _desync_named(tmp_path, done.stderr)


def _slurm_tasks(out: Path, *extra: str) -> list[subprocess.CompletedProcess[str]]:
    """Two processes with the variables srun gives the tasks of a step (one node, two tasks)."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = clean_env(SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                        SLURM_NODEID="0", SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NAME="train",
                        SLURM_JOB_ID="4242", SLURM_NODELIST="localhost", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, LIGHTNING, str(out), *extra], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env))
    done = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=200)
        finally:
            proc.kill()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def test_lightning_under_slurms_variables(tmp_path: Path, lightning_on_gloo: list[dict[str, Any]]) -> None:
    for done in _slurm_tasks(tmp_path, "unison"):
        assert done.returncode == 0, done.stderr[-3000:]
    _same(outcome(tmp_path), lightning_on_gloo)


def test_a_desync_under_slurms_variables_is_named_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    started = _slurm_tasks(tmp_path, "unison", "desync")
    assert all(done.returncode != 0 for done in started)
    _desync_named(tmp_path, started[0].stderr)


@pytest.fixture(scope="module")
def accelerate_on_gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("accelerate-gloo")
    done = run([*TORCHRUN, ACCELERATE, str(out), "gloo"], clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return outcome(out)


def test_accelerate(tmp_path: Path, accelerate_on_gloo: list[dict[str, Any]]) -> None:
    done = run([*TORCHRUN, ACCELERATE, str(tmp_path), "unison"], clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    _same(outcome(tmp_path), accelerate_on_gloo)


def test_a_desync_under_accelerate_is_named_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    done = run([*TORCHRUN, ACCELERATE, str(tmp_path), "unison", "desync"], clean_env())
    assert done.returncode != 0
    _desync_named(tmp_path, done.stderr)
