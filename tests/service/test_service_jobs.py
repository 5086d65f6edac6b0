"""Real 2-rank jobs with UNISON_CONTROLLER=grpc: a stopped rank is detected; the status table is live."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"
SECRET = "f" * 64


def job(script: str, tmp_path: Path, env: dict[str, str], timeout: float = 60) -> subprocess.Popen:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    full_env = dict(os.environ, UNISON_CONTROLLER="grpc", UNISON_SECRET=SECRET, **env)
    return subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, str(path)], cwd=tmp_path,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        pytest.fail(f"job did not end within {timeout} s:\n{out}")
    return out


def test_a_stopped_rank_is_detected_and_named(tmp_path: Path) -> None:
    process = job("""
        import os, signal, time, numpy as np, unison as hvd
        from unison.errors import AbortedError
        hvd.init()
        pids = hvd.allgather_object(os.getpid())
        if hvd.rank() == 1:
            os.kill(os.getpid(), signal.SIGSTOP)   # frozen: no heartbeats from here on
        start = time.monotonic()
        try:
            hvd.allreduce(np.ones(3), name="after.stop")
        except AbortedError as exc:
            print(f"rank 0 raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        os.kill(pids[1], signal.SIGKILL)            # end the frozen rank so the job can finish
        os._exit(3)
    """, tmp_path, {"UNISON_HEARTBEAT_TIMEOUT_SECONDS": "2"})
    start = time.monotonic()
    out = finish(process, 60)
    assert "rank 0 raised after" in out, out
    assert "rank 1 (" in out and "sent no heartbeat for 2." in out, out
    assert process.returncode != 0
    assert time.monotonic() - start < 30


def test_status_table_of_a_running_job(tmp_path: Path) -> None:
    process = job("""
        import logging, time, numpy as np, unison as hvd
        hvd.init()
        if hvd.rank() == 0:
            address = hvd._runtime.job().engine.backend.control.address
            open("address.tmp", "w").write(address)
            import os; os.replace("address.tmp", "address")
        if hvd.rank() == 1:
            handle = hvd.allreduce_async(np.ones(2), name="lonely")   # rank 0 joins it later
        while hvd.rank() == 0 and not __import__("os").path.exists("go"):
            time.sleep(0.1)
        if hvd.rank() == 0:
            hvd.allreduce(np.ones(2), name="lonely")
        else:
            hvd.synchronize(handle)
        hvd.shutdown()
        print(f"rank {hvd.rank() if hvd.is_initialized() else 'done'} finished", flush=True)
    """, tmp_path, {})
    deadline = time.monotonic() + 30
    while not (tmp_path / "address").exists():
        assert time.monotonic() < deadline and process.poll() is None, "job never started"
        time.sleep(0.1)
    address = (tmp_path / "address").read_text()
    time.sleep(2.5)  # a couple of heartbeats carry rank 1's pending tensor
    env = dict(os.environ, UNISON_SECRET=SECRET)
    status = subprocess.run([sys.executable, "-m", "unison.status", address], env=env,
                            capture_output=True, text=True, timeout=30)
    wrong = subprocess.run([sys.executable, "-m", "unison.status", address], capture_output=True,
                           text=True, timeout=30, env=dict(os.environ, UNISON_SECRET="x" * 40))
    (tmp_path / "go").write_text("")
    out = finish(process, 60)
    assert process.returncode == 0, out
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "job of 2 ranks"
    rank1 = next(line for line in lines if line.strip().startswith("1 "))
    assert "waiting: allreduce.lonely" in rank1
    assert "others wait for it: allreduce.lonely" in status.stdout  # rank 0 owes it
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
