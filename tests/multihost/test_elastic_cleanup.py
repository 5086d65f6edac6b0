"""An elastic job removes its shared-memory store on the remote hosts when it ends (emulated hosts).

Emulated hosts share one file system, so each remote host here also gets a /dev/shm of its own: a
tmpfs in a persistent mount namespace that the test's launcher-exec enters before handing over to the
cluster's. The ranks on h1 and h2 then write their host's commits into that host's /dev/shm only,
where the driver (on h0) can reach them solely through the launcher, as on real hosts. The launcher
refuses ``rm`` on h2, so that host shows the failure being logged and its store left in place.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from unison.testing.hosts import EmulatedHosts, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs a job across emulated hosts")]

REMOTE = ("h1", "h2")

# Mpiexec calls it as `SCRIPT [ssh options] HOST COMMAND...`.
LAUNCHER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
echo "$host $*" >> {log}
case "$host $*" in
  "h2 rm "*) echo "refusing to remove anything on h2" >&2; exit 3 ;;
esac
case "$host" in
{cases}
esac
exec nsenter --target="$holder" --mount -- {real} "$host" "$@"
"""


def _sh(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


@contextlib.contextmanager
def _private_shm(hosts: Sequence[str]) -> Iterator[dict[str, int]]:
    """A mount namespace per host with a tmpfs of its own on /dev/shm, held by a sleeping process; yields
    host -> that process's pid (``nsenter --target PID --mount`` enters it)."""
    holders: dict[str, subprocess.Popen[str]] = {}
    try:
        for host in hosts:
            holders[host] = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 "mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && echo ready && exec sleep 600"],
                stdout=subprocess.PIPE, text=True)
            assert holders[host].stdout is not None and holders[host].stdout.readline() == "ready\n"
        yield {host: holder.pid for host, holder in holders.items()}
    finally:
        for holder in holders.values():
            holder.kill()
            holder.communicate(timeout=30)


def _stores_on(holder: int) -> list[str]:
    """The elastic stores, with their host directories, in the /dev/shm of the namespace `holder` holds."""
    listing = _sh("nsenter", f"--target={holder}", "--mount", "--", "sh", "-c",
                  "cd /dev/shm && ls -d unison-elastic-*/* 2>/dev/null || true")
    return listing.split()


def test_the_store_is_removed_on_each_remote_host_and_a_failure_is_logged(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    with EmulatedHosts(hosts=3, slots=1) as cluster, _private_shm(REMOTE) as holders:
        launcher = tmp_path / "launcher-exec"
        cases = "\n".join(f"  {host}) holder={pid} ;;" for host, pid in holders.items())
        launcher.write_text(LAUNCHER.format(log=log, cases=cases, real=cluster.launcher_exec))
        launcher.chmod(0o755)
        seen: dict[str, list[str]] = {}

        def look(commits: int, size: int) -> None:
            if commits >= 4 and not seen:
                seen.update({host: _stores_on(pid) for host, pid in holders.items()})

        (tmp_path / "job").mkdir()
        job = run(tmp_path / "job", ["h0", "h1", "h2"],
                  ["-np", "3", "--launcher-exec", str(launcher), "--iface", "eth0"],
                  env={"ELASTIC_SAMPLES": "36", "ELASTIC_STEP_SECONDS": "0.1"}, schedule=look, timeout=120,
                  wrap=lambda cmd: cluster.exec_command(0, cmd))
        left = {host: _stores_on(pid) for host, pid in holders.items()}
    check_committed(job, samples=36, epochs=2, size=3)
    # While it ran, each remote host kept its commits in its own /dev/shm, under the driver's store path.
    assert [p.split("/")[1] for p in seen["h1"]] == ["h1"] and [p.split("/")[1] for p in seen["h2"]] == ["h2"], seen
    store = "/dev/shm/" + seen["h1"][0].split("/")[0]
    assert seen["h2"][0].split("/")[0] == seen["h1"][0].split("/")[0]
    calls = log.read_text().splitlines()
    assert f"h1 rm -rf -- {store}" in calls and f"h2 rm -rf -- {store}" in calls, calls
    assert not any(line.startswith("h0 ") for line in calls), calls  # the driver's own host: removed locally
    assert left == {"h1": [], "h2": seen["h2"]}, left
    assert (f"could not remove the job's store {store} on h2: {launcher} h2 'rm -rf -- {store}' exited with "
            "status 3: refusing to remove anything on h2") in job.stderr, job.stderr
    assert not Path(store).exists()
