"""unisonrun's options, --check-build, wrong-mpiexec detection, and unison.run."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from faults._jobs import BOUND_SECONDS, PYTHON, run_job, unisonrun

from unison.errors import LaunchError
from unison.launcher import run
from unison.launcher.mpi.mpiexec import library_vendor

from . import _work

pytestmark = pytest.mark.timeout(120)

PRINT_RANK = "import unison; unison.init(); print('hello from', unison.rank(), flush=True)"


def test_run_returns_results_in_rank_order() -> None:
    assert run(_work.total_of_ranks, args=(2.0,), np=2, timeout=60) == [(0, 6.0), (1, 6.0)]


def test_run_reraises_the_failing_ranks_exception_with_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(KeyError, match="missing key on rank 1") as info:
        run(_work.fail_on_rank_1, np=2, timeout=60)
    assert time.monotonic() - start < BOUND_SECONDS + 5
    assert any("rank 1 of 2" in note for note in info.value.__notes__)
    assert "Traceback on rank 1" in str(info.value.__cause__)
    assert "_work.py" in str(info.value.__cause__)


def test_tag_output_and_output_filename(tmp_path: Path) -> None:
    done = run_job(unisonrun("-np", "2", "--tag-output", PYTHON, "-c", PRINT_RANK))
    assert done.returncode == 0, done.output
    assert "[1] hello from 1" in done.output and "[0] hello from 0" in done.output
    done = run_job(unisonrun("-np", "2", "--output-filename", str(tmp_path), PYTHON, "-c", PRINT_RANK))
    assert done.returncode == 0, done.output
    assert (tmp_path / "rank.1.stdout").read_text().strip() == "hello from 1"


def test_env_pass_through() -> None:
    code = "import os; print('value=' + os.environ['UNISON_TEST_VALUE'])"
    done = run_job(unisonrun("-np", "2", "-x", "UNISON_TEST_VALUE=abc", PYTHON, "-c", code))
    assert done.returncode == 0 and done.output.count("value=abc") == 2, done.output


def test_a_bad_setting_stops_the_launch_before_any_rank_starts(tmp_path: Path) -> None:
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'a').write('x')"
    done = run_job(unisonrun("-np", "2", PYTHON, "-c", code),
                   env={"UNISON_CONTROLLER": "grpc", "UNISON_SERVICE_ADDR": "bogus"})
    assert done.returncode == 2, done.output
    assert done.output.startswith("unisonrun: UNISON_SERVICE_ADDR must be host:port"), done.output
    done = run_job(unisonrun("-np", "2", "-x", "HOROVOD_CYCLE_TIME=soon", PYTHON, "-c", code))
    assert done.returncode == 2 and "HOROVOD_CYCLE_TIME must be" in done.output, done.output
    assert not started.exists()
    done = run_job(unisonrun("-np", "2", PYTHON, "-c", code), env={"UNISON_SERVICE_ADDR": "127.0.0.1:0"})
    assert done.returncode == 0 and started.read_text() == "xx", done.output


@pytest.mark.parametrize("attempt", range(3))
def test_a_timeline_rank_0_cannot_open_names_rank_0_and_the_path(tmp_path: Path, attempt: int) -> None:
    # Rank 0's own set-up fails; rank 1 then fails too (it learns rank 0 could not start) and usually
    # exits first: the launcher must still name rank 0, the cause, and only rank 0.
    path = tmp_path / "missing" / "timeline.json"
    done = run_job(unisonrun("-np", "2", PYTHON, "-c", PRINT_RANK), env={"HOROVOD_TIMELINE": str(path)})
    assert done.returncode == 2, done.output  # the job could not start
    named = [line for line in done.output.splitlines() if line.startswith("unisonrun:")]
    assert len(named) == 1 and named[0].startswith("unisonrun: rank 0 ("), done.output
    assert (f"could not start: ConfigError: The timeline file '{path}' cannot be opened for writing: No such file "
            "or directory. Give the path of a file in an existing, writable directory (UNISON_TIMELINE / "
            "HOROVOD_TIMELINE). Rank 0 (on host ") in named[0], named
    assert f"init() failed: rank 0 could not start: ConfigError: The timeline file '{path}'" in done.output


def test_timeout_stops_the_job() -> None:
    done = run_job(unisonrun("-np", "2", "--timeout", "2", PYTHON, "-c", "import time; time.sleep(60)"))
    assert done.returncode == 124, done.output
    assert "--timeout" in done.output and done.seconds < 2 + BOUND_SECONDS


def test_check_build_passes() -> None:
    done = run_job(unisonrun("--check-build"), deadline=120)
    assert done.returncode == 0, done.output
    assert "MPI library" in done.output and "MPICH" in done.output
    assert "thread level" in done.output and "self-test: PASS" in done.output


def test_launcher_refuses_an_mpiexec_of_another_mpi(tmp_path: Path) -> None:
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (OpenRTE) 4.1.2'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    done = run_job(unisonrun("-np", "2", "--mpiexec", str(fake), PYTHON, "-c", "pass"))
    assert done.returncode == 2, done.output
    assert "belongs to a different MPI (openmpi)" in done.output
    assert "rank 0 of a job of size 1" in done.output and "--mpiexec PATH" in done.output


def test_init_explains_an_mpiexec_of_another_mpi() -> None:
    # What every process sees under a foreign mpiexec: the launcher's variables say 2, MPI says 1.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    env["OMPI_COMM_WORLD_SIZE"] = "2"
    env["OMPI_COMM_WORLD_RANK"] = "0"
    import subprocess

    done = subprocess.run([PYTHON, "-c", "import unison; unison.init()"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "The launcher started 2 processes, but MPI sees each as a job of size 1" in done.stderr
    assert "different MPI library" in done.stderr


@pytest.mark.parametrize("text, vendor", [
    ("HYDRA build details:\n    Version: 5.0.2", "mpich"),
    ("MPICH Version:      5.0.2", "mpich"),
    ("mpiexec (Open MPI) 5.0.3", "openmpi"),
    ("Open MPI v4.1.2, package: ...", "openmpi"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10", "intel"),
])
def test_vendor_names(text: str, vendor: str) -> None:
    assert library_vendor(text) == vendor


def test_run_refuses_bad_np() -> None:
    with pytest.raises(LaunchError, match="np must be at least 1. Got np=0"):
        run(_work.total_of_ranks, args=(1.0,), np=0)


STATUS_JOB = """
import os, sys, time, numpy as np, unison
unison.init()
go = sys.argv[1]
if unison.rank() == 1:
    handle = unison.allreduce_async(np.ones(2), name="held")   # rank 0 joins once told to go
while unison.rank() == 0 and not os.path.exists(go):
    time.sleep(0.1)
if unison.rank() == 0:
    unison.allreduce(np.ones(2), name="held")
else:
    unison.synchronize(handle)
unison.shutdown()
"""


def test_status_finds_the_running_job_without_address_or_secret(tmp_path: Path) -> None:
    import subprocess

    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "UNISON_CONTROLLER": "grpc"}
    env.pop("UNISON_SECRET", None)
    (tmp_path / "run").mkdir(mode=0o700)
    script = tmp_path / "job.py"
    script.write_text(STATUS_JOB)
    go = tmp_path / "go"
    nothing = run_job(unisonrun("--status"), env=env)
    assert nothing.returncode == 2 and "No unisonrun job of yours is running" in nothing.output
    job = subprocess.Popen(unisonrun("-np", "2", PYTHON, str(script), str(go)), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            status = run_job(unisonrun("--status"), env=env)
            if status.returncode == 0 and "waiting: allreduce.held" in status.output:
                break
            assert time.monotonic() < deadline and job.poll() is None, status.output
            time.sleep(0.5)
        lines = status.output.splitlines()
        assert any(line.startswith("unisonrun job ") and str(script) in line for line in lines)
        assert "job of 2 ranks" in lines
        assert "others wait for it: allreduce.held" in status.output  # rank 0 owes it
        service = next((tmp_path / "run" / "unison").glob("*.json"))
        assert json.loads(service.read_text())["np"] == 2
        mode = (Path(json.loads(service.read_text())["dir"]) / "service.json").stat().st_mode
        assert stat.S_IMODE(mode) == 0o600
    finally:
        go.write_text("")
        out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    assert not list((tmp_path / "run" / "unison").glob("*.json")), "the job record outlived the job"
    mpi_job = run_job(unisonrun("--status", "12345"), env=env)
    assert mpi_job.returncode == 2 and "No running unisonrun job has pid 12345" in mpi_job.output


def test_status_of_a_job_without_the_service_says_how_to_get_one(tmp_path: Path) -> None:
    import subprocess

    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "UNISON_CONTROLLER": "mpi"}
    (tmp_path / "run").mkdir(mode=0o700)
    script = tmp_path / "job.py"
    script.write_text(STATUS_JOB)
    go = tmp_path / "go"
    job = subprocess.Popen(unisonrun("-np", "2", PYTHON, str(script), str(go)), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "run" / "unison").glob("*.json")):
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.2)
        status = run_job(unisonrun("--status"), env=env)
    finally:
        go.write_text("")
        out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    assert status.returncode == 2 and "start it with UNISON_CONTROLLER=grpc" in status.output, status.output
