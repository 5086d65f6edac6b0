"""unison in jobs started by torchrun, without MPI: the Horovod-style API and the "unison" backend over
torch's store and gloo, the failures named, a restart that starts a fresh job (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

PROGRAM = str(Path(__file__).resolve().parent / "_program.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def torchrun(n: int, out: Path, mode: str, *extra: str, env: dict[str, str] | None = None,
             deadline: float = 150.0, device: str = "cpu") -> subprocess.CompletedProcess[str]:
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", str(n), *extra, PROGRAM, str(out), mode, device]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    environment.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=deadline, env=environment)


@pytest.mark.parametrize("n", [1, 2, 3])  # one process starts no MPI either
def test_the_api_and_the_backend_run_under_torchrun_without_mpi(tmp_path: Path, n: int) -> None:
    check_api_results(torchrun(n, tmp_path, "api"), tmp_path, n)


def test_the_grpc_control_plane_under_torchrun(tmp_path: Path) -> None:
    """UNISON_CONTROLLER=grpc: rank 0's authenticated coordinator service, data over gloo, no MPI."""
    check_api_results(torchrun(3, tmp_path, "api", env={"UNISON_CONTROLLER": "grpc"}), tmp_path, 3)
    results = [json.loads((tmp_path / f"result-{r}").read_text()) for r in range(3)]
    assert all(result["grpc"] for result in results)  # the service carried the control plane


def test_the_horovod_style_and_ddp_examples_run_unchanged_and_train_as_under_mpiexec(tmp_path: Path) -> None:
    """The same scripts, the same first epoch, to the printed digit, under torchrun as under mpiexec."""
    from unison.testing.run import find_mpiexec

    root = Path(__file__).resolve().parents[2]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    for script in ("examples/pytorch_mnist.py", "examples/pytorch_ddp_digits.py"):
        def args(launcher: str, script: str = script) -> list[str]:  # a checkpoint of each run's own
            return [script, "--epochs", "1", *(["--checkpoint", str(tmp_path / f"{launcher}.pt")] if "mnist" in script else [])]

        under_torchrun = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", *args("torchrun")],
                                        cwd=root, capture_output=True, text=True, timeout=150, env=environment)
        assert under_torchrun.returncode == 0, under_torchrun.stdout[-2000:] + under_torchrun.stderr[-3000:]
        mpiexec = find_mpiexec()
        if mpiexec is None:
            continue
        under_mpiexec = subprocess.run([mpiexec, "-n", "2", sys.executable, *args("mpiexec")], cwd=root,
                                       capture_output=True, text=True, timeout=150, env=environment)
        assert under_mpiexec.returncode == 0, under_mpiexec.stdout[-2000:] + under_mpiexec.stderr[-3000:]
        epoch = [line for line in under_torchrun.stdout.splitlines() if line.startswith("epoch 1:")]
        assert epoch and epoch == [line for line in under_mpiexec.stdout.splitlines() if line.startswith("epoch 1:")]


def check_api_results(done: subprocess.CompletedProcess[str], tmp_path: Path, n: int) -> None:
    """What every rank of an `api` run wrote (tests/gpu runs the same on CUDA tensors)."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = [json.loads((tmp_path / f"result-{r}").read_text()) for r in range(n)]
    total = float(sum(range(1, n + 1)))
    for r, result in enumerate(results):
        assert (result["rank"], result["size"], result["local_rank"]) == (r, n, r)
        assert result["total"] == [total] * 3
        assert result["gathered"] == [float(i) for i in range(n) for _ in range(i + 1)]
        assert result["plain"] == [float(n)] * 2
        assert result["part"] == [float(sum(range(1, n)) if r else 0.0)] * 2
        assert result["mpi4py"] is False  # no MPI anywhere
    assert len({tuple(result["grad"]) for result in results}) == 1  # DDP averaged the same gradient


@pytest.mark.parametrize("controller", ["", "grpc"], ids=["gloo", "grpc"])
def test_a_rank_that_raises_ends_the_job_named(tmp_path: Path, controller: str) -> None:
    done = torchrun(2, tmp_path, "raise", env={"UNISON_CONTROLLER": controller} if controller else None)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "unison: rank 1 (" in output and "ValueError: injected failure at step 2" in output, output[-3000:]
    assert "AbortedError: rank 1 (" in output, output[-3000:]  # rank 0 learned who, and why


def test_a_frozen_rank_is_named_on_the_others(tmp_path: Path) -> None:
    # torchrun stops a frozen process only by its SIGKILL, 30 s after the others ended: once rank 0 has
    # named it, the test sends that SIGKILL itself
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", PROGRAM, str(tmp_path), "frozen"]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    environment["UNISON_PEER_TIMEOUT_SECONDS"] = "2"
    log = tmp_path / "torchrun.log"
    with open(log, "wb") as sink:
        job = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=environment)
        try:
            deadline = time.monotonic() + 90
            while "rank 1 sent no heartbeat" not in log.read_text(errors="replace") and time.monotonic() < deadline:
                assert job.poll() is None, log.read_text(errors="replace")[-3000:]
                time.sleep(0.2)
            _kill_frozen(tmp_path)
            assert job.wait(timeout=60) != 0
        finally:
            _kill_frozen(tmp_path)  # never left stopped behind a failed assertion
            job.kill()
    output = log.read_text(errors="replace")
    assert "AbortedError: rank 1 stopped answering: rank 0 waited" in output, output[-3000:]
    assert "rank 1 sent no heartbeat" in output


def _kill_frozen(tmp_path: Path) -> None:
    try:
        os.kill(int((tmp_path / "pid-1").read_text()), signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass


@pytest.mark.parametrize("mode", ["restart", "restart-pg"])  # hvd.init(), or init_process_group first
def test_a_restart_starts_a_fresh_job(tmp_path: Path, mode: str) -> None:
    # Each rank's output of each attempt also goes to a file of its own: torchrun's summary of a failed
    # job would push a rank's last lines out of the captured output's tail.
    logs = tmp_path / "logs"
    done = torchrun(2, tmp_path, mode, "--max-restarts", "1", "--log-dir", str(logs), "--tee", "3")
    ranks = "".join(f"--- {path.relative_to(logs)}:\n{path.read_text(errors='replace')[-2500:]}\n"
                    for path in sorted(logs.rglob("*.log")) if path.stat().st_size)
    assert done.returncode == 0, ranks + done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0-1", "done-1-1"]
