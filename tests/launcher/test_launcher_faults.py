"""unisonrun under faults: killed launcher, killed rank, timeout, secrets on command lines, bad programs;
MPICH's shared memory left by a stopped job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from faults._jobs import BOUND_SECONDS, PYTHON, SCENARIO, alive, assert_no_strays, run_job, unisonrun

from unison.errors import LaunchError
from unison.launcher import run

from . import _work

pytestmark = pytest.mark.timeout(180)

SEES_VALUES = """
import os, sys, time, unison
unison.init()
out = sys.argv[1]
with open(f"{out}/seen-{unison.rank()}", "w") as f:
    f.write(os.environ.get("UNISON_TEST_GIVEN", "") + " " + os.environ.get("UNISON_TEST_EXPORTED", ""))
while not os.path.exists(f"{out}/go"):
    time.sleep(0.05)
unison.shutdown()
"""


# Each rank records the MPICH shared-memory segments it maps and its pid; with "kill", rank 1 then
# SIGKILLs itself once rank 0 has recorded its own; every rank waits.
RECORDS_SEGMENTS = """
import os, sys, time, unison, numpy as np
unison.init()
out = sys.argv[1]
unison.allreduce(np.ones(4))
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line})
open(f"{out}/segments-{unison.rank()}", "w").write("\\n".join(mapped))
open(f"{out}/pid-{unison.rank()}", "w").write(str(os.getpid()))
if sys.argv[2] == "kill" and unison.rank() == 1:
    deadline = time.monotonic() + 30
    while not os.path.exists(f"{out}/pid-0") and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), 9)
time.sleep(60)
"""


def _segments(directory: Path) -> list[str]:
    """The segments the ranks recorded (there must be some: MPICH's ranks of one host share memory)."""
    recorded = [line for p in sorted(directory.glob("segments-*")) for line in p.read_text().split()]
    assert recorded, "no rank recorded a /dev/shm/mpich_shm_* segment"
    return recorded


def _command_lines() -> dict[int, bytes]:
    lines = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                lines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                pass
    return lines


def _wait_for(predicate, seconds: float, what: str, proc: subprocess.Popen[str]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate()[0] if proc.poll() is not None else ""
            raise AssertionError(f"{what} did not happen within {seconds} s:\n{out[-3000:]}")
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def test_x_values_reach_the_ranks_but_no_command_line(tmp_path: Path) -> None:
    given, exported = f"given-{os.getpid()}-{time.time_ns()}", f"exported-{os.getpid()}-{time.time_ns()}"
    script = tmp_path / "job.py"
    script.write_text(SEES_VALUES)
    env = {**os.environ, "UNISON_TEST_EXPORTED": exported}
    proc = subprocess.Popen(unisonrun("-np", "2", "-x", f"UNISON_TEST_GIVEN={given}", "-x", "UNISON_TEST_EXPORTED",
                                      PYTHON, str(script), str(tmp_path)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _wait_for(lambda: len(list(tmp_path.glob("seen-*"))) == 2, 60, "both ranks starting", proc)
        lines = _command_lines()  # while mpiexec, its proxy, the keepers and the ranks run
        assert len([line for line in lines.values() if b"job.py" in line]) >= 4, lines
        leaks = {pid: line.replace(b"\0", b" ") for pid, line in lines.items()
                 if given.encode() in line or exported.encode() in line}
        assert not leaks, f"values visible in command lines: {leaks}"
        assert f"UNISON_TEST_GIVEN={'*' * len(given)}".encode() in lines[proc.pid]
    finally:
        (tmp_path / "go").write_text("")
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    for rank in (0, 1):
        assert (tmp_path / f"seen-{rank}").read_text() == f"{given} {exported}"


FAKE_SSH = """#!/bin/sh
# Start Hydra's proxy for a "remote" host with an empty environment, as ssh to another machine would.
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
shift
exec env -i PATH=/usr/bin:/bin sh -c "$*"
"""


def test_x_values_reach_ranks_on_other_hosts_without_a_command_line(tmp_path: Path) -> None:
    value = f"remote-{os.getpid()}-{time.time_ns()}"
    script = tmp_path / "job.py"
    script.write_text(SEES_VALUES.replace("import os, sys, time, unison\nunison.init()", "import os, sys, time")
                      .replace("unison.rank()", "os.environ['PMI_RANK']").replace("unison.shutdown()", ""))
    ssh = tmp_path / "fake_ssh.sh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    proc = subprocess.Popen(unisonrun("-np", "2", "-H", "elsewhere1:1,elsewhere2:1", "--launcher-exec", str(ssh),
                                      "-x", "UNISON_TEST_EXPORTED", PYTHON, str(script), str(tmp_path)),
                            env={**os.environ, "UNISON_TEST_EXPORTED": value}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: len(list(tmp_path.glob("seen-*"))) == 2, 60, "both ranks starting", proc)
        lines = _command_lines()
        assert len([line for line in lines.values() if b"hydra_pmi_proxy" in line]) >= 2, lines
        leaks = {pid: line for pid, line in lines.items() if value.encode() in line}
        assert not leaks, f"value visible in command lines: {leaks}"
    finally:
        (tmp_path / "go").write_text("")
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert sorted((tmp_path / f"seen-{rank}").read_text() for rank in (0, 1)) == [f" {value}"] * 2


@pytest.mark.parametrize("controller", ["mpi", "grpc"])
def test_killing_unisonrun_stops_every_rank_and_removes_the_job_directory(tmp_path: Path, controller: str) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "UNISON_CONTROLLER": controller}
    env.pop("UNISON_SECRET", None)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen(unisonrun("-np", "2", PYTHON, SCENARIO, str(pids), "none", "-1"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: len(list(pids.glob("pid-*"))) == 2, 60, "both ranks starting", proc)
        record = next((runtime / "unison").glob("*.json"))
        directory = Path(json.loads(record.read_text())["dir"])
        if controller == "grpc":
            _wait_for(lambda: (directory / "service.json").exists(), 30, "the service file", proc)
        mpiexec = [pid for pid in _children(proc.pid) if b"mpiexec" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        ranks = [int(p.read_text()) for p in pids.glob("pid-*")]
        assert len(mpiexec) == 1 and directory.is_dir()
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = killed_at + BOUND_SECONDS
        while (any(alive(pid) for pid in mpiexec + ranks) or directory.exists() or record.exists()) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        seconds = time.monotonic() - killed_at
        left = [pid for pid in mpiexec + ranks if alive(pid)]
        assert not left, f"still running {BOUND_SECONDS} s after unisonrun was killed: {left}"
        assert not directory.exists(), f"{directory} (the job's secret, markers) outlived unisonrun"
        assert not record.exists()
        print(f"job stopped and directory removed {seconds:.2f} s after SIGKILL of unisonrun")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert_no_strays(pids, 2)


@pytest.mark.parametrize("failing, attempt", [(1, n) for n in range(5)] + [(0, n) for n in range(2)])
def test_the_rank_killed_by_a_signal_is_the_one_named(tmp_path: Path, failing: int, attempt: int) -> None:
    done = run_job(unisonrun("-np", "2", PYTHON, SCENARIO, str(tmp_path), "sigkill", str(failing)))
    assert done.returncode != 0, done.output
    named = [line for line in done.output.splitlines() if line.startswith("unisonrun:")]
    assert len(named) == 1, done.output
    assert named[0].startswith(f"unisonrun: rank {failing} (") and "killed by signal 9 (SIGKILL)" in named[0], \
        done.output
    assert "ended without shutting unison down" in named[0]
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_timeout_is_the_first_message_and_stopped_ranks_are_no_failures(tmp_path: Path) -> None:
    done = run_job(unisonrun("-np", "2", "--timeout", "5", PYTHON, SCENARIO, str(tmp_path), "none", "-1"))
    assert done.returncode == 124, done.output
    ours = [line for line in done.output.splitlines() if line.startswith("unisonrun:")]
    assert ours == ["unisonrun: the job ran past --timeout 5 s; stopping every rank (exit status 124)."], done.output
    first = done.output.index("unisonrun:")
    assert "BAD TERMINATION" not in done.output[:first], done.output
    assert "ended without shutting" not in done.output
    assert "Ctrl-C" not in done.output, done.output  # Hydra's notice of the SIGINT unisonrun sent is held back
    # Interrupted as by Ctrl-C (SIGINT, not SIGTERM): every rank's finally: block ran.
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == ["finally-0", "finally-1"], done.output
    assert done.seconds < 5 + BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)


def test_run_reports_its_timeout() -> None:
    with pytest.raises(LaunchError, match=r"unison.run: the job ran past timeout=3 s; stopped every rank\."):
        run(_work.sleep_in_a_loop, np=2, timeout=3)


@pytest.mark.parametrize("program, mode", [("train.py", 0o755), ("./train.py", 0o644), ("./train.py", 0o755)])
def test_a_script_mpiexec_cannot_start_is_refused_before_anything_starts(tmp_path: Path, program: str,
                                                                        mode: int) -> None:
    started = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(started)!r}, 'a').write('x')\n")
    script.chmod(mode)
    done = subprocess.run(unisonrun("-np", "2", program), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("unisonrun: "), done.stderr
    assert f"unisonrun -np 2 python {program}" in done.stderr and "chmod +x" in done.stderr, done.stderr
    assert "execvp" not in done.stderr and not started.exists()


def test_a_job_stopped_abruptly_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(RECORDS_SEGMENTS)
    done = run_job(unisonrun("-np", "2", PYTHON, str(program), str(tmp_path), "kill"))
    assert done.returncode != 0 and "rank 1 (" in done.output, done.output
    left = [path for path in _segments(tmp_path) if os.path.exists(path)]
    assert not left, f"MPICH's segments outlived the job: {left}"


def test_killing_unisonrun_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(RECORDS_SEGMENTS)
    proc = subprocess.Popen(unisonrun("-np", "2", PYTHON, str(program), str(tmp_path), "wait"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: len(list(tmp_path.glob("pid-*"))) == 2, 60, "both ranks starting", proc)
        ranks = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + BOUND_SECONDS
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [pid for pid in ranks if alive(pid)]
        recorded = _segments(tmp_path)
        while any(os.path.exists(path) for path in recorded) and time.monotonic() < deadline:
            time.sleep(0.02)  # the reaper removes them after its kill
        left = [path for path in recorded if os.path.exists(path)]
        assert not left, f"MPICH's segments outlived the job: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
