"""A rank on another host than unisonrun's, where the launcher's directory does not exist, is still named.

unisonrun makes its job directories under a directory (its TMPDIR) that h1 and h2 each see replaced
by an empty one of their own, so their ranks and keepers can only reach the launcher through its
marker relay, as on real hosts. Rank 1, on h1,
SIGKILLs itself or raises. In a plain job unisonrun names it, on h1; in an elastic job the driver
also blacklists h1 and the job goes on from its last commit on h0 and h2, bit for bit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from multihost._private_mounts import launcher_exec_into, private_mounts
from unison.testing.hosts import EmulatedHosts, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs a job across emulated hosts")]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every emulated host sees, with ``jobs/`` in it for unisonrun's job directories."""
    path = Path(tempfile.mkdtemp(prefix="unison-test-"))
    (path / "jobs").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _hidden_jobs(shared_dir: Path) -> contextlib.AbstractContextManager[dict[str, int]]:
    """h1 and h2 each see an empty ``jobs/`` of their own; unisonrun (on h0) makes its directories there."""
    return private_mounts(("h1", "h2"), str(shared_dir / "jobs"))


def test_a_rank_killed_on_a_host_without_the_launchers_directory_is_named(shared_dir: Path) -> None:
    with EmulatedHosts(hosts=3, slots=1) as cluster, _hidden_jobs(shared_dir) as holders:
        launcher = launcher_exec_into(shared_dir / "launcher-exec", holders, cluster.launcher_exec)
        job = run(shared_dir, cluster.hostnames, ["-np", "3", "--min-np", "2", "--launcher-exec", launcher,
                                                  "--iface", "eth0"],
                  env={"ELASTIC_KILL": "2:1", "TMPDIR": str(shared_dir / "jobs")}, timeout=120,
                  wrap=lambda cmd: cluster.exec_command(0, cmd))
    check_committed(job, samples=24, epochs=2, size=2)
    assert "rank 1 (h1, pid " in job.stderr and "killed by signal 9 (SIGKILL)" in job.stderr, job.stderr
    assert "epoch 0 failed (exit status" in job.stderr and "blacklisting h1 for good (rank 1 failed)" in job.stderr
    assert "epoch 1: 2 ranks on h0:1,h2:1" in job.stderr, job.stderr


DIES = """
import os, signal, sys, unison
unison.init()
unison.barrier()
if unison.rank() == 1:
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("rank 1 gives up on h1")
unison.barrier()
"""


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_plain_job_names_the_rank_that_failed_on_another_host(shared_dir: Path, how: str) -> None:
    program = shared_dir / "dies.py"
    program.write_text(DIES)
    with EmulatedHosts(hosts=3, slots=1) as cluster, _hidden_jobs(shared_dir) as holders:
        launcher = launcher_exec_into(shared_dir / "launcher-exec", holders, cluster.launcher_exec)
        cmd = [sys.executable, "-m", "unison.launcher", "-np", "3", "-H", cluster.hosts_argument,
               "--launcher-exec", launcher, "--iface", "eth0", sys.executable, str(program), how]
        done = subprocess.run(cluster.exec_command(0, cmd), capture_output=True, text=True, timeout=100,
                              env=dict(os.environ, TMPDIR=str(shared_dir / "jobs")))
    assert done.returncode != 0
    if how == "kill":
        assert "unisonrun: rank 1 (h1, pid " in done.stderr, done.stderr
        assert "ended without shutting unison down (killed by signal 9 (SIGKILL))" in done.stderr, done.stderr
    else:
        assert "unisonrun: rank 1 (h1, pid " in done.stderr and "ValueError: rank 1 gives up on h1" in done.stderr
    # unisonrun names rank 1 alone; the others say in one line each where they stopped and who reports
    named = [line for line in done.stderr.splitlines() if line.startswith("unisonrun: rank ")]
    assert named and all(line.startswith("unisonrun: rank 1 (h1, pid ") for line in named), done.stderr
    for rank in (0, 2):
        lines = [line for line in done.stderr.splitlines() if f"rank {rank} (" in line]
        assert all(line.startswith(f"unison: rank {rank} (") and line.endswith("unisonrun reports it.")
                   for line in lines), done.stderr
