"""`unisonrun --pservers` under real faults: a lost trainer, a lost server; what the launcher says and does.

Faults are sent from outside by pid (SIGKILL, SIGSTOP) at a chosen point; the trainer timeout and
the reconnect window are lowered through their settings so that a hang costs seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from unison.ps import _checkpoint

SCRIPT = """
import json, os, sys, time
from pathlib import Path
import numpy as np
import unison.ps as ps

out = Path(os.environ["OUT_DIR"])
client = ps.init()
me = client.trainer
ps.declare_dense({"w": np.zeros(4, np.float32), "v": np.zeros(4, np.float32)}, ps.SGD(0.01))
(out / f"pid-{me}").write_text(str(os.getpid()))
steps = 0
try:
    while not (out / "stop").exists() or steps < 5:
        ps.pull_dense()
        ps.push(dense={"w": np.ones(4, np.float32), "v": np.ones(4, np.float32)})
        steps += 1
        if steps == 5:
            (out / f"ready-{me}").write_text("")
        time.sleep(0.01)
    if os.environ.get("WAIT_LOST"):  # until every server counts the others lost
        deadline = time.monotonic() + 30
        stats = ps.server_statistics()
        while not all(len(s["lost_trainers"]) == client.num_trainers - 1 for s in stats):
            assert time.monotonic() < deadline, stats
            time.sleep(0.1)
            stats = ps.server_statistics()
        (out / f"stats-{me}.json").write_text(json.dumps(stats))
    if os.environ.get("DUMP_STATS"):
        (out / f"stats-{me}.json").write_text(json.dumps(ps.server_statistics()))
except (ps.TrainerLostError, ps.ServerUnavailableError) as exc:
    (out / f"error-{me}.json").write_text(json.dumps([type(exc).__name__, str(exc)]))
    sys.exit(3)
print(f"trainer {me} done after {steps} steps", flush=True)
ps.shutdown()
"""


def _unisonrun(tmp_path: Path, np_: int, mode: str, **extra: str) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env.update(OUT_DIR=str(tmp_path), UNISON_PS_MODE=mode, UNISON_PS_TRAINER_TIMEOUT_SECONDS="1.5",
               UNISON_PS_RECONNECT_SECONDS="4")
    env.update(extra)
    return subprocess.Popen([sys.executable, "-m", "unison.launcher", "-np", str(np_), "--pservers", "2",
                             sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _wait_files(paths: list[Path], launcher: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def _wait_until(condition: Callable[[], bool], launcher: subprocess.Popen, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _version(checkpoint: Path) -> int:
    """The version of the shard in a parameter server's checkpoint."""
    found = _checkpoint.load(checkpoint)
    assert found is not None, f"no checkpoint at {checkpoint}"
    return int(found[0]["version"])


def _restarted(tmp_path: Path, index: int, killed: int) -> bool:
    """Whether a parameter server `index` other than the `killed` one runs tmp_path's job."""
    try:
        return _server_pid(tmp_path, index) != killed
    except AssertionError:  # none runs: the launcher has not started it again yet
        return False


def _server_pid(tmp_path: Path, index: int) -> int:
    """The pid of parameter server `index` of the job running tmp_path's script (from its environment)."""
    for entry in Path("/proc").iterdir():
        try:
            if str(tmp_path / "train.py") not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            environ = set((entry / "environ").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue
        if {"UNISON_PS_ROLE=server", f"UNISON_PS_SERVER_INDEX={index}"} <= environ:
            return int(entry.name)
    raise AssertionError(f"no parameter server {index} runs {tmp_path / 'train.py'}")


def _launcher_lines(stderr: str, about: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("unisonrun:") and about in line]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_async_a_lost_trainer_does_not_stop_the_others_and_is_named_once(tmp_path, fault) -> None:
    launcher = _unisonrun(tmp_path, 2, "async", WAIT_LOST="1")
    try:
        _wait_files([tmp_path / f"ready-{t}" for t in range(2)], launcher, 60)
        victim = int((tmp_path / "pid-1").read_text())
        os.kill(victim, fault)
        time.sleep(0.5)
        (tmp_path / "stop").write_text("")
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert re.search(r"^trainer 0 done after \d+ steps$", stdout, re.M), (stdout, stderr)
    for stats in json.loads((tmp_path / "stats-0.json").read_text()):  # every server names it
        assert f"pid {victim}) sent nothing for" in stats["lost_trainers"]["1"], stats["lost_trainers"]
    named = _launcher_lines(stderr, "trainer 1")
    if fault == signal.SIGKILL:
        assert named == [f"unisonrun: parameter-server trainer 1 ({os.uname().nodename}, pid {victim}) killed by "
                         "signal 9 (SIGKILL)."], stderr
    else:
        assert len(named) == 1 and named[0].startswith(
            f"unisonrun: parameter-server trainer 1 ({os.uname().nodename}, pid {victim}) was still running after "
            "every parameter server had ended without it; they counted it lost (trainer 1 "), stderr
        assert named[0].endswith("it died or is stopped), so unisonrun killed it."), stderr
    assert "before unison.init()" not in stderr and "trainer 0" not in "".join(_launcher_lines(stderr, "")), stderr
    assert launcher.returncode == 128 + signal.SIGKILL, stderr  # mpiexec's status: a trainer was killed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_sync_the_others_get_trainer_lost_naming_it_and_the_job_ends(tmp_path, fault) -> None:
    launcher = _unisonrun(tmp_path, 3, "sync")
    try:
        _wait_files([tmp_path / f"ready-{t}" for t in range(3)], launcher, 60)
        victim = int((tmp_path / "pid-1").read_text())
        os.kill(victim, fault)
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    for t in (0, 2):
        kind, message = json.loads((tmp_path / f"error-{t}.json").read_text())
        assert kind == "TrainerLostError" and re.search(
            rf"step \d+ did not complete on parameter server \d: trainer 1 \(\S+, pid {victim}\) pushed steps up to "
            r"\d+ and sent nothing for \d+\.\d s; it died or is stopped", message), message
    named = _launcher_lines(stderr, "trainer 1 ")
    assert len(named) == 1 and f"parameter-server trainer 1 ({os.uname().nodename}, pid {victim})" in named[0], stderr
    assert sorted(_launcher_lines(stderr, "exited with status 3")) == [
        f"unisonrun: parameter-server trainer {t} ({os.uname().nodename}, pid {int((tmp_path / f'pid-{t}').read_text())}) "
        "exited with status 3." for t in (0, 2)], stderr
    assert "before unison.init()" not in stderr
    assert launcher.returncode != 0


@pytest.mark.timeout(120)
def test_a_lost_server_is_started_again_from_its_checkpoint_and_the_trainers_go_on(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    # a window long enough for a fresh server process to start, however loaded the machine
    launcher = _unisonrun(tmp_path, 2, "async", DUMP_STATS="1", UNISON_PS_CHECKPOINT_DIR=str(ckpt),
                          UNISON_PS_CHECKPOINT_SECONDS="0.2", UNISON_PS_RECONNECT_SECONDS="30")
    try:
        _wait_files([tmp_path / f"ready-{t}" for t in range(2)] + [ckpt / "server-1-of-2.npz"], launcher, 60)
        server = _server_pid(tmp_path, 1)
        os.kill(server, signal.SIGKILL)
        # The trainers go on with the server started again: once it runs (the killed one writes no more),
        # its checkpoint moves past the version it restored when it applies their pushes.
        checkpoint = ckpt / "server-1-of-2.npz"
        _wait_until(lambda: _restarted(tmp_path, 1, server), launcher, 60, "server 1 to start again")
        restored = _version(checkpoint)
        _wait_until(lambda: _version(checkpoint) > restored, launcher, 60, "a push to server 1 again")
        (tmp_path / "stop").write_text("")
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr
    assert sorted(re.findall(r"^trainer \d done", stdout, re.M)) == ["trainer 0 done", "trainer 1 done"], stdout
    (line,) = _launcher_lines(stderr, "parameter server 1")
    assert re.fullmatch(rf"unisonrun: parameter server 1 \(127\.0\.0\.1:\d+, pid {server}\) killed by signal 9 "
                        rf"\(SIGKILL\); starting it again on 127\.0\.0\.1:\d+, from its last checkpoint in "
                        rf"{re.escape(str(ckpt))} \(restart 1 of 3\); the trainers wait for it up to "
                        r"UNISON_PS_RECONNECT_SECONDS \(30 s\)\.", line), line
    for t in range(2):
        stats = json.loads((tmp_path / f"stats-{t}.json").read_text())
        assert [s["restored"] for s in stats] == [False, True] and stats[1]["pushes"] > 0, stats


@pytest.mark.timeout(120)
def test_a_lost_server_without_checkpoints_is_named_and_the_trainers_stop_within_the_window(tmp_path) -> None:
    launcher = _unisonrun(tmp_path, 2, "async")
    try:
        _wait_files([tmp_path / f"ready-{t}" for t in range(2)], launcher, 60)
        server = _server_pid(tmp_path, 1)
        os.kill(server, signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    (line,) = _launcher_lines(stderr, "parameter server 1 (")
    assert re.fullmatch(rf"unisonrun: parameter server 1 \(127\.0\.0\.1:\d+, pid {server}\) killed by signal 9 "
                        r"\(SIGKILL\); it is not started again \(the job keeps no checkpoints "
                        r"\(UNISON_PS_CHECKPOINT_DIR\) to resume it from\): its shard is lost, and each trainer that "
                        r"calls it stops with ServerUnavailableError within UNISON_PS_RECONNECT_SECONDS \(4 s\)\.",
                        line), line
    for t in range(2):
        kind, message = json.loads((tmp_path / f"error-{t}.json").read_text())
        assert kind == "ServerUnavailableError" and message.startswith(
            "parameter server 1 (127.0.0.1:"), message
    assert launcher.returncode != 0
