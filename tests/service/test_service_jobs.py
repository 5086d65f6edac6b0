"""Real jobs with UNISON_CONTROLLER=grpc: a stopped rank is detected and every live rank told; rank 0's
failure reaches the others with its cause; a malformed message delays nothing; the status table is live."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"
SECRET = "f" * 64


def job(script: str, tmp_path: Path, env: dict[str, str], ranks: int = 2) -> subprocess.Popen:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    full_env = dict(os.environ, UNISON_CONTROLLER="grpc", UNISON_SECRET=SECRET, **env)
    return subprocess.Popen([str(MPIEXEC), "-n", str(ranks), sys.executable, str(path)], cwd=tmp_path,
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
            address = hvd._job.runtime.job().engine.backend.control.address
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
    env = dict(os.environ, UNISON_SECRET=SECRET)

    def read_status() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unison.status", address], env=env,
                              capture_output=True, text=True, timeout=30)

    # until a heartbeat has carried rank 1's pending tensor into the table (30 s: a hang guard)
    shown = ("waiting: allreduce.lonely", "others wait for it: allreduce.lonely")
    deadline = time.monotonic() + 30
    status = read_status()
    while not all(text in status.stdout for text in shown) and time.monotonic() < deadline:
        time.sleep(0.5)
        status = read_status()
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


# Each live rank reports what its collective raised and when, then ends the frozen rank (an MPI job
# whose rank is stopped cannot finish on its own) and leaves at once.
FROZEN = """
    import os, signal, sys, time, numpy as np, unison as hvd
    from unison.errors import AbortedError
    frozen = int(sys.argv[1])
    hvd.init()
    pids = hvd.allgather_object(os.getpid())
    hvd.allreduce(np.ones(3), name="before.stop")
    start = time.monotonic()
    if hvd.rank() == frozen:
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        hvd.allreduce(np.ones(3), name="after.stop")
        print(f"rank {hvd.rank()} finished its allreduce", flush=True)
    except AbortedError as exc:
        print(f"rank {hvd.rank()} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    # every live rank reports before the job is torn down: each marks its report done, waits for the
    # others' marks, then gives mpiexec a moment to forward the last lines (the teardown cuts them off)
    live = sorted(set(range(hvd.size())) - {frozen})
    open(f"reported-{hvd.rank()}", "w").close()
    deadline = time.monotonic() + 30
    while not all(os.path.exists(f"reported-{rank}") for rank in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    if hvd.rank() == live[0]:
        os.kill(pids[frozen], signal.SIGKILL)
    os._exit(3)
"""


def frozen_job(tmp_path: Path, frozen: int, ranks: int, aggregation: str) -> tuple[str, float]:
    path = tmp_path / "frozen.py"
    path.write_text(textwrap.dedent(FROZEN))
    env = dict(os.environ, UNISON_CONTROLLER="grpc", UNISON_SECRET=SECRET, UNISON_HEARTBEAT_TIMEOUT_SECONDS="2",
               UNISON_SERVICE_HOST_AGGREGATION=aggregation)
    start = time.monotonic()
    process = subprocess.Popen([str(MPIEXEC), "-n", str(ranks), sys.executable, str(path), str(frozen)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    return finish(process, 60), time.monotonic() - start


def _report(out: str, rank: int) -> str:
    """Rank `rank`'s 'rank R raised after S s: ...' line; ranks share one stream, so their lines may run
    together: the report is found wherever it starts, up to the end of its line."""
    match = re.search(rf"rank {rank} raised after [^\n]*", out)
    return match.group(0) if match else ""


@pytest.mark.parametrize("aggregation", ["1", "0"])
def test_a_stopped_rank_0_is_reported_to_the_others_as_an_abort(tmp_path: Path, aggregation: str) -> None:
    """Rank 0 (and the service) stopped: rank 1's heartbeats go unanswered for 2 s; its collective fails
    with the reason, whether it waits in its own exchange or for its host leader."""
    out, _ = frozen_job(tmp_path, frozen=0, ranks=2, aggregation=aggregation)
    line = _report(out, 1)
    assert "got no answer to its heartbeats from the coordinator service" in line, out
    assert "rank 0 is stopped or unreachable" in line, out
    assert float(line.split()[4]) < 6, out  # 2 s of silence, checked once a second, plus load


@pytest.mark.parametrize("aggregation", ["1", "0"])
def test_a_stopped_rank_is_reported_to_every_live_rank(tmp_path: Path, aggregation: str) -> None:
    out, _ = frozen_job(tmp_path, frozen=1, ranks=3, aggregation=aggregation)
    for rank in (0, 2):
        line = _report(out, rank)
        assert "rank 1 (" in line and "sent no heartbeat for 2." in line, out
        assert float(line.split()[4]) < 6, out


@pytest.mark.parametrize("aggregation", ["1", "0"])
@pytest.mark.parametrize("failing", [0, 1])
def test_an_engine_failure_reaches_the_other_rank_with_its_cause(tmp_path: Path, failing: int,
                                                                 aggregation: str) -> None:
    """Under host aggregation the other rank waits for its host peer over MPI and learns the reason
    from a heartbeat's reply; the failing rank's Abort call returns once it has."""
    process = job("""
        import os, time, numpy as np, unison as hvd
        from unison.errors import UnisonError
        hvd.init()
        hvd.allreduce(np.ones(3), name="first")
        if hvd.rank() == int(os.environ["FAILING"]):
            def broken(row):
                raise OSError(f"injected: rank {hvd.rank()}'s control plane broke")
            hvd._job.runtime.job().engine.backend.allgather_status = broken
        start = time.monotonic()
        try:
            hvd.allreduce(np.ones(3), name="second")
        except UnisonError as exc:
            print(f"rank {hvd.rank()} raised after {time.monotonic() - start:.1f} s: "
                  f"{type(exc).__name__}: {exc}", flush=True)
        hvd.shutdown()  # as at exit: waits for the engine thread, which tells the service
        os._exit(3)
    """, tmp_path, {"UNISON_SERVICE_HOST_AGGREGATION": aggregation, "FAILING": str(failing)})
    out = finish(process, 60)
    line = _report(out, 1 - failing)
    assert "AbortedError" in line and f"injected: rank {failing}'s control plane broke" in line, out
    assert "died or is unreachable" not in line, out
    assert float(line.split()[4]) < 5, out


def test_a_malformed_message_with_the_secret_does_not_delay_the_end_of_the_job(tmp_path: Path) -> None:
    """Six undeserializable messages on each stream method, each stream kept open; before, one of them
    often left a call unfinished and rank 0's shutdown waited 30 s for its engine."""
    process = job(f"""
        import threading, time, grpc, numpy as np, unison as hvd
        from unison.rpc.security import TOKEN_KEY
        from unison.service.methods import RANK_KEY
        hvd.init()
        if hvd.rank() == 0:
            channel = grpc.insecure_channel(hvd._job.runtime.job().engine.backend.control.address)
            never = threading.Event()
            def bad():
                yield b"\\xff\\xff\\xff\\xff"
                never.wait()
            for method in ["Negotiate", "Heartbeats"] * 6:
                call = channel.stream_stream(f"/unison.v1.Coordinator/{{method}}")
                try:
                    list(call(bad(), metadata=((TOKEN_KEY, "{SECRET}"), (RANK_KEY, "1")), timeout=10))
                except grpc.RpcError as exc:
                    print(f"{{method}}: {{exc.code().name}}: {{exc.details()}}", flush=True)
        hvd.allreduce(np.ones(3), name="after")
        start = time.monotonic()
        hvd.shutdown()
        print(f"shutdown took {{time.monotonic() - start:.1f}} s", flush=True)
    """, tmp_path, {"UNISON_SERVICE_HOST_AGGREGATION": "0"})
    out = finish(process, 90)
    assert process.returncode == 0, out
    assert out.count("INVALID_ARGUMENT: Negotiate: message 0 (4 bytes) is not a valid Exchange") == 6, out
    # The two ranks print to one stream: their lines may run together, so match anywhere.
    times = [float(t) for t in re.findall(r"shutdown took ([0-9.]+) s", out)]
    assert len(times) == 2 and max(times) < 3, out


def test_a_job_over_tls_runs_and_its_service_refuses_plain_text(tmp_path: Path) -> None:
    """UNISON_TLS_*: every rank's channel to rank 0's service is TLS; a client without it gets nowhere."""
    import shutil

    key = tmp_path / "key.pem"
    shutil.copy(Path(__file__).parents[1] / "data" / "tls" / "key.pem", key)
    key.chmod(0o600)
    tls = {"UNISON_TLS_CERT_FILE": str(Path(__file__).parents[1] / "data" / "tls" / "cert.pem"),
           "UNISON_TLS_KEY_FILE": str(key)}
    process = job("""
        import os, time, numpy as np, unison as hvd
        hvd.init()
        if hvd.rank() == 0:
            open("address.tmp", "w").write(hvd._job.runtime.job().engine.backend.control.address)
            os.replace("address.tmp", "address")
        while not os.path.exists("go"):
            time.sleep(0.1)
        print(f"rank {hvd.rank()} sum {hvd.allreduce(np.ones(2), op=hvd.Sum, name='over.tls').tolist()}", flush=True)
        hvd.shutdown()
    """, tmp_path, tls)
    deadline = time.monotonic() + 30
    while not (tmp_path / "address").exists():
        assert time.monotonic() < deadline and process.poll() is None, "job never started"
        time.sleep(0.1)
    address = (tmp_path / "address").read_text()
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_TLS_")}

    def read_status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unison.status", address], capture_output=True, text=True,
                              timeout=60, env=dict(env, UNISON_SECRET=SECRET))

    plain = read_status(plain_env)
    secure = read_status(dict(plain_env, **tls))
    (tmp_path / "go").write_text("")
    out = finish(process, 60)
    assert process.returncode == 0, out
    assert "rank 0 sum [2.0, 2.0]" in out and "rank 1 sum [2.0, 2.0]" in out, out
    assert secure.returncode == 0 and secure.stdout.splitlines()[0] == "job of 2 ranks", secure.stdout + secure.stderr
    assert plain.returncode != 0 and "job of" not in plain.stdout, plain.stdout + plain.stderr
    assert "if the job sets UNISON_TLS_*, set the same here" in plain.stderr, plain.stderr
