"""An elastic job removes its shared-memory store on the remote hosts when it ends (emulated hosts).

Emulated hosts share one file system, so each remote host here also gets a /dev/shm of its own: a
tmpfs in a persistent mount namespace that the test's launcher-exec enters before handing over to the
cluster's. The ranks on h1 and h2 then write their host's commits into that host's /dev/shm only,
where the driver (on h0) can reach them solely through the launcher, as on real hosts. The launcher
refuses ``rm`` on h2, so that host shows the failure being logged and its store left in place.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from multihost._private_mounts import launcher_exec_into, private_mounts
from unison.testing.hosts import EmulatedHosts, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs a job across emulated hosts")]

REMOTE = ("h1", "h2")

# Logs every call; refuses to remove anything on h2.
BEFORE = """echo "$host $*" >> {log}
case "$host $*" in
  "h2 rm "*) echo "refusing to remove anything on h2" >&2; exit 3 ;;
esac"""


def _sh(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


def _stores_on(holder: int) -> list[str]:
    """The elastic stores, with their host directories, in the /dev/shm of the namespace `holder` holds."""
    listing = _sh("nsenter", f"--target={holder}", "--mount", "--", "sh", "-c",
                  "cd /dev/shm && ls -d unison-elastic-*/* 2>/dev/null || true")
    return listing.split()


def test_the_store_is_removed_on_each_remote_host_and_a_failure_is_logged(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    with EmulatedHosts(hosts=3, slots=1) as cluster, private_mounts(REMOTE, "/dev/shm") as holders:
        launcher = launcher_exec_into(tmp_path / "launcher-exec", holders, cluster.launcher_exec,
                                      BEFORE.format(log=log))
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
