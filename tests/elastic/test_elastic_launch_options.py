"""unisonrun's elastic mode: the shared-memory store is removed however the driver ends; per-epoch output
options; the options that do not apply to an elastic job are refused; horovodrun's elastic command
lines (fixed hosts, --log-level, HOROVOD_ELASTIC_TIMEOUT)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from unison.launcher.cli import main

from ._harness import HOSTS, check_committed, run

pytestmark = pytest.mark.timeout(120)

PYTHON = sys.executable

# Each rank writes into the job's store, says where it is and its pid, prints a line, and waits a while.
PROGRAM = """\
import os, sys, time
from pathlib import Path
import unison
unison.init()
store = Path(os.environ["UNISON_ELASTIC_STORE"])
(store / f"marker-{unison.rank()}").write_text("x")
out = Path(sys.argv[1])
(out / f"store-{unison.rank()}").write_text(f"{store} {os.getpid()}")
print("hello from", unison.rank(), flush=True)
time.sleep(float(sys.argv[2]))
unison.shutdown()
"""


def _command(tmp_path: Path, *options: str, sleep_seconds: float = 0.0) -> list[str]:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    return [PYTHON, "-m", "unison.launcher", "-np", "2", "--host-discovery-script", f"cat {hosts}",
            "--discovery-interval", "0.2", *options, PYTHON, str(program), str(tmp_path), str(sleep_seconds)]


def _wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.05)


def _stores(tmp_path: Path) -> tuple[Path, list[int]]:
    words = [(tmp_path / f"store-{rank}").read_text().split() for rank in range(2)]
    assert words[0][0] == words[1][0], words
    return Path(words[0][0]), [int(pid) for _, pid in words]


def test_the_store_is_removed_when_the_job_ends(tmp_path: Path) -> None:
    done = subprocess.run(_command(tmp_path), capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    store, _ = _stores(tmp_path)
    assert str(store).startswith("/dev/shm/unison-elastic-") or not os.path.isdir("/dev/shm")
    assert not store.exists()


def test_the_store_is_removed_when_unisonrun_is_killed(tmp_path: Path) -> None:
    proc = subprocess.Popen(_command(tmp_path, sleep_seconds=60), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: all((tmp_path / f"store-{rank}").exists() for rank in range(2)), 60, "both ranks")
        store, pids = _stores(tmp_path)
        assert (store / "marker-0").exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _wait_for(lambda: not store.exists(), 15, f"the reaper to remove {store}")
        _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 15, "the ranks to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tag_output_tags_each_epochs_lines(tmp_path: Path) -> None:
    done = subprocess.run(_command(tmp_path, "--tag-output"), capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "[0] hello from 0" in output and "[1] hello from 1" in output, output


def test_output_filename_writes_each_epochs_files_under_epoch_n(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(_command(tmp_path, "--output-filename", str(out)), capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert any(name.startswith("epoch-0/") for name in files), files
    text = "".join(p.read_text() for p in (out / "epoch-0").rglob("*") if p.is_file())
    assert "hello from 0" in text and "hello from 1" in text, files


@pytest.mark.parametrize(("options", "message"), [
    (["-H", "localhost:2"], r"unisonrun: -H/--hosts cannot be combined with --host-discovery-script: an elastic "
     r"job runs on the hosts the discovery script prints. Drop one of them"),
    (["--hostfile", "hosts"], r"unisonrun: --hostfile cannot be combined with --host-discovery-script"),
    (["--pservers", "1"], r"unisonrun: --pservers 1 cannot be combined with --host-discovery-script: parameter "
     r"servers run beside a fixed set of trainers, not an elastic one."),
])
def test_options_that_do_not_apply_to_an_elastic_job_are_refused(
        options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = tmp_path / "started"
    status = main(["-np", "2", "--host-discovery-script", "echo localhost:2", *options,
                   PYTHON, "-c", f"open({str(started)!r}, 'w')"])
    assert status == 2
    assert re.search(message, capsys.readouterr().err)
    assert not started.exists()


def test_horovodruns_elastic_job_on_fixed_hosts_with_its_log_level(tmp_path: Path) -> None:
    # horovodrun -np 2 --min-np 1 -H a:1,b:1 --log-level DEBUG: no discovery script. Rank 1 dies; its
    # host leaves and the job goes on on the other one from the last commit.
    job = run(tmp_path, [], ["-np", "2", "--min-np", "1", "-H", f"{HOSTS[0]}:1,{HOSTS[1]}:1", "--log-level", "debug"],
              env={"ELASTIC_KILL": "2:1"}, discover=False)
    check_committed(job, samples=24, epochs=2, size=1)
    assert f"epoch 0: 2 ranks on {HOSTS[0]}:1,{HOSTS[1]}:1" in job.stderr
    assert f"blacklisting {HOSTS[1]} for good (rank 1 failed)" in job.stderr
    assert f"epoch 1: 1 ranks on {HOSTS[0]}:1" in job.stderr
    assert re.search(r"\[unison rank 0/1 \S+\] DEBUG ", job.stderr), job.stderr  # the ranks log at DEBUG


def test_horovod_elastic_timeout_from_the_environment(tmp_path: Path) -> None:
    job = run(tmp_path, [], ["-np", "3", "--min-np", "3", "-H", f"{HOSTS[0]}:1,{HOSTS[1]}:1"],
              env={"HOROVOD_ELASTIC_TIMEOUT": "1"},
              discover=False)
    assert job.returncode == 1
    assert ("waited 1 s (HOROVOD_ELASTIC_TIMEOUT) for hosts: 2 ranks available, 3 needed (--min-np 3); "
            f"discovered: {HOSTS[0]}:1, {HOSTS[1]}:1. Add hosts, or lower --min-np.") in job.stderr, job.stderr


@pytest.mark.parametrize(("options", "message"), [
    (["--min-np", "1"], r"unisonrun: --min-np make the job elastic, which needs its hosts: --host-discovery-script "
     r"SCRIPT \(hosts that come and go\) or -H/--hostfile \(fixed hosts"),
    (["--elastic-timeout", "0", "--min-np", "1", "-H", "localhost:1"], r"unisonrun: --elastic-timeout is how long an "
     r"elastic job waits for its --min-np slots: a positive number of seconds. Got --elastic-timeout 0."),
    (["--log-level", "loud"], r"argument --log-level: invalid choice: 'LOUD' \(choose from "),
])
def test_elastic_and_log_options_that_cannot_work_say_why(options: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["-np", "2", *options, PYTHON, "-c", "pass"])
    except SystemExit as exc:  # argparse's own refusal
        status = int(exc.code or 0)
    assert status == 2
    assert re.search(message, capsys.readouterr().err)
