"""`unisonrun --status` of a running elastic job: its epoch, hosts, commits, resets, blacklist, live table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from unison.elastic.store import CommitId, StateStore
from unison.launcher.jobs import elastic_lines

from ._harness import HOSTS

pytestmark = pytest.mark.timeout(150)

PYTHON = sys.executable

# Commits a step counter every 0.1 s until OUT/go exists (rank 0 decides for all); rank 1 of the first
# launch kills itself after commit 3.
PROGRAM = """\
import os, signal, sys, time
from pathlib import Path
import unison.torch as hvd
hvd.init()
out = Path(sys.argv[1])
state = hvd.elastic.TorchState(step=0)

@hvd.elastic.run
def train(state):
    while not hvd.broadcast_object((out / "go").exists(), root_rank=0, name="go"):
        state.step += 1
        state.commit()
        if state.step == 3 and hvd.rank() == 1 and not (out / "killed").exists():
            (out / "killed").write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.1)

train(state)
(out / f"done-{hvd.rank()}").write_text(str(state.step))
"""


def _unisonrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "unison.launcher", *args]


def _environment(tmp_path: Path, controller: str) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    # Several names of this machine are several hosts to the service too: it needs an address.
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run), "UNISON_CONTROLLER": controller,
           "UNISON_SERVICE_ADDR": "127.0.0.1:0"}
    env.pop("UNISON_SECRET", None)
    return env


def _start(tmp_path: Path, hosts: Sequence[str], args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    discovery = tmp_path / "hosts"
    discovery.write_text("".join(f"{h}:1\n" for h in hosts))
    return subprocess.Popen(_unisonrun("--host-discovery-script", f"cat {discovery}", "--discovery-interval", "0.2",
                                       *args, PYTHON, str(program), str(tmp_path)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _status_until(job: subprocess.Popen[str], env: dict[str, str], wanted: Sequence[str],
                  seconds: float) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + seconds
    while True:
        status = subprocess.run(_unisonrun("--status"), env=env, capture_output=True, text=True, timeout=60)
        if status.returncode == 0 and all(w in status.stdout for w in wanted):
            return status
        assert time.monotonic() < deadline and job.poll() is None, (status.stdout, status.stderr)
        time.sleep(0.5)


def _end(job: subprocess.Popen[str], seconds: float) -> str:
    """The job's output once it ends, waiting `seconds` before killing unisonrun (its reaper ends the rest)."""
    try:
        return job.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        return job.communicate(timeout=30)[0]


def test_status_shows_the_epoch_commits_resets_blacklist_and_live_table(tmp_path: Path) -> None:
    env = _environment(tmp_path, "grpc")
    job = _start(tmp_path, HOSTS, ["-np", "2", "--min-np", "2", "--max-np", "2",
                                            "--elastic-timeout", "20"], env)
    try:
        status = _status_until(job, env, ["epoch 1:", "job of 2 ranks"], 90)
    finally:
        (tmp_path / "go").write_text("")
        out = _end(job, 60)
    assert job.returncode == 0, out
    lines = status.stdout.splitlines()
    assert lines[0] == f"unisonrun elastic job {job.pid}: {PYTHON} {tmp_path / 'program.py'} {tmp_path}", lines
    assert re.fullmatch(rf"  epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1, started \d+ s ago", lines[1]), lines
    commits = re.fullmatch(r"  commits: commit (\d+) \(written in epoch [01], newest on \S+\); "
                           r"resets: 1 \(1 after a failure\)", lines[2])
    assert commits and int(commits.group(1)) >= 3, lines
    assert lines[3] == f"  blacklisted: {HOSTS[1]} for good (rank 1 failed)", lines
    assert lines[4] == f"  discovered: {HOSTS[0]}:1, {HOSTS[1]}:1, {HOSTS[2]}:1", lines
    assert "job of 2 ranks" in lines[5:], lines
    assert sum(1 for line in lines if re.match(r"\s+[01]\s+\S+\s+\d+\s+\d+ ", line)) == 2, lines
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0", "done-1"]
    assert not list((tmp_path / "run" / "unison").glob("*.json")), "the job record outlived the job"


def test_status_of_an_elastic_job_waiting_for_hosts(tmp_path: Path) -> None:
    env = _environment(tmp_path, "mpi")
    job = _start(tmp_path, HOSTS[:2], ["-np", "3", "--elastic-timeout", "60"], env)
    try:
        status = _status_until(job, env, ["waiting for hosts"], 60)
    finally:
        _end(job, 0)
    assert status.stdout.splitlines()[1:] == [
        "  no epoch started yet",
        f"  waiting for hosts: 2 ranks available, 3 needed (--min-np 3); discovered: {HOSTS[0]}:1, {HOSTS[1]}:1",
        "  commits: none yet; resets: 0 (0 after a failure)",
        "  blacklisted: none",
        f"  discovered: {HOSTS[0]}:1, {HOSTS[1]}:1",
        "  (no live rank table: the running epoch has no coordinator service; start the job with "
        "UNISON_CONTROLLER=grpc for one)",
    ], status.stdout


def test_status_lines_of_an_ended_epoch_and_a_cooling_down_host(tmp_path: Path) -> None:
    store = tmp_path / "store"
    StateStore(store, "a").write(CommitId(epoch=2, commit=7), [b"x"])
    StateStore(store, "b").write(CommitId(epoch=1, commit=9), [b"y"])
    job = {"pid": 42, "dir": str(store), "command": ["python", "train.py"], "elastic": {
        "epoch": 2, "np": 3, "hosts": "a:2,b:1", "epoch_started": 100.0, "running": False, "waiting": "",
        "resets": 2, "failures": 1, "discovered": "a:2, b:1, c:1",
        "blacklist": {"c": [112.34, "unreachable: ssh exited with status 255"], "d": [None, "rank 3 failed"],
                      "e": [109.0, "rank 4 failed"]}}}
    assert elastic_lines(job, now=110.0) == [
        "unisonrun elastic job 42: python train.py",
        "  epoch 2 ended (it ran 3 ranks on a:2,b:1); the next is not started yet",
        "  commits: commit 7 (written in epoch 2, newest on a); resets: 2 (1 after a failure)",
        "  blacklisted: c for 2.3 s more (unreachable: ssh exited with status 255); d for good (rank 3 failed)",
        "  discovered: a:2, b:1, c:1",
    ]


def test_a_launch_ending_while_status_reads_its_table_is_said_so(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from unison.launcher.jobs import _table

    assert _table(tmp_path / "gone" / "service.json", 1.0) == 0
    assert "the launch that had one has just ended; ask again" in capsys.readouterr().out


def test_status_names_a_host_store_it_refuses_and_reads_the_others(tmp_path: Path) -> None:
    store = tmp_path / "store"
    StateStore(store, "a").write(CommitId(epoch=1, commit=4), [b"x"])
    StateStore(store, "b").write(CommitId(epoch=1, commit=5), [b"y"])
    (store / "b").chmod(0o777)  # writable by others: not trusted, whatever its commit says
    job = {"pid": 7, "dir": str(store), "command": ["train"], "elastic": {
        "epoch": 1, "np": 2, "hosts": "a:1,b:1", "epoch_started": 1.0, "running": False, "waiting": "",
        "resets": 0, "failures": 0, "discovered": "a:1, b:1", "blacklist": {}}}
    lines = elastic_lines(job, now=2.0)
    assert "  commits: commit 4 (written in epoch 1, newest on a); resets: 0 (0 after a failure)" in lines
    refused = [line for line in lines if line.startswith("  store refused: b: ")]
    assert len(refused) == 1 and str(store / "b") in refused[0], lines
