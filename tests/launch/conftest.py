"""Shared by the launch tests: a clean environment, free ports, and the reading of each rank's outcome."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRAIN = str(HERE / "_train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (an MPI launcher's, SLURM's, torch's, unison's)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "SLURM_", "HYDRA_", "UNISON_", "MPIR_", "TORCHELASTIC_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "NODE_RANK", "GROUP_RANK"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def outcome(out: Path, size: int = 2) -> list[dict[str, Any]]:
    """What each rank of a run wrote (its parameters), in rank order."""
    return [json.loads((out / f"params-{r}").read_text()) for r in range(size)]


def errors(out: Path, size: int = 2) -> list[str]:
    return [(out / f"error-{r}").read_text() if (out / f"error-{r}").exists() else "" for r in range(size)]


def run(args: list[str], env: dict[str, str], timeout: float = 150.0, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd or ROOT)


def by_hand(out: Path, form: str, backend: str, *extra: str, size: int = 2,
            env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """`size` processes started here, each with torch's env:// variables, as a person would by hand."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, TRAIN, str(out), form, backend, *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=clean_env(RANK=str(r), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port, **(env or {})))
             for r in range(size)]
    done = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=150)
        finally:
            proc.kill()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


@pytest.fixture(scope="session")
def gloo_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The parameters two ranks end with on gloo, started by mp.spawn over tcp://: what every form must give."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo")
    done = run([TRAIN, str(out), "spawn-tcp", "gloo"], clean_env(LAUNCH_TEST_WHERE=f"127.0.0.1:{free_port()}"))
    assert done.returncode == 0, done.stderr[-3000:]
    return outcome(out)


def same_as_gloo(results: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    """Every rank ends with the same parameters, equal to gloo's, on the unison backend, in a job of two."""
    assert [(r["rank"], r["size"], r["backend"]) for r in results] == [(0, 2, "unison"), (1, 2, "unison")]
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["params"] == reference[0]["params"]
    assert [r["metric"] for r in results] == [1.0, 1.0]
