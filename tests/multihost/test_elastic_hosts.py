"""Elastic jobs across emulated hosts: hosts added and torn down, a rank killed in mid-allreduce, too few hosts.

The discovery schedule grows the job from h0, h1 to h0, h1, h2 (a commit and a relaunch), then tears
down h1's network namespace with its ranks in it (a host vanishing: a failure and a relaunch on h0,
h2). Another job's rank on h1 is SIGKILLed while a 32 MiB allreduce crosses 100 Mbit/s links. The
committed state must equal a replay of its commit history bit for bit, on every rank, with every
sample index processed exactly once per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from unison.testing.hosts import EmulatedHosts, _remove_namespace, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs a job across emulated hosts")]


def test_two_then_three_hosts_then_one_torn_down(tmp_path: Path) -> None:
    with EmulatedHosts(hosts=3, slots=1) as cluster:
        torn: list[int] = []

        def schedule(commits: int, size: int) -> Sequence[str] | None:
            if size == 2 and commits >= 3 and not torn:
                return ["h0", "h1", "h2"]
            if size == 3 and commits >= 9 and not torn:
                torn.append(commits)
                _remove_namespace(cluster.namespaces[1])  # h1 and its rank are gone at once
                return ["h0", "h2"]
            return None

        job = run(tmp_path, ["h0", "h1"], ["-np", "2", "--min-np", "2", "--max-np", "3",
                                           "--launcher-exec", cluster.launcher_exec, "--iface", "eth0"],
                  env={"ELASTIC_SAMPLES": "36", "ELASTIC_STEP_SECONDS": "0.1"}, schedule=schedule,
                  timeout=150, wrap=lambda cmd: cluster.exec_command(0, cmd))
    check_committed(job, samples=36, epochs=2, size=2)
    assert "epoch 0 committed and stopped for a change of hosts" in job.stderr, job.stderr
    assert "epoch 1: 3 ranks on h0:1,h1:1,h2:1" in job.stderr
    assert "epoch 1 failed" in job.stderr
    # Discovery may still list h1 for a moment after it vanished: launches there fail until it does not.
    # A survivor's own log lines may come after the launcher's last line.
    epochs = [line for line in job.stderr.splitlines() if line.startswith("unisonrun: elastic: epoch ")]
    assert epochs[-1].endswith(": 2 ranks on h0:1,h2:1"), job.stderr


def _across(cluster: EmulatedHosts, np: int, min_np: int) -> list[str]:
    return ["-np", str(np), "--min-np", str(min_np), "--max-np", str(len(cluster.hostnames)),
            "--launcher-exec", cluster.launcher_exec, "--iface", "eth0"]


def test_a_rank_killed_in_mid_allreduce_leaves_the_other_hosts_going_on(tmp_path: Path) -> None:
    with EmulatedHosts(hosts=3, slots=1, rate_mbit=100) as cluster:
        job = run(tmp_path, cluster.hostnames, _across(cluster, 3, 2),
                  env={"ELASTIC_KILL_DURING": "3:1", "ELASTIC_KILL_DELAY": "0.5"}, timeout=180,
                  wrap=lambda cmd: cluster.exec_command(0, cmd))
    check_committed(job, samples=24, epochs=2, size=2)
    # Every rank was inside the 32 MiB allreduce (over 2 s at 100 Mbit/s) when h1's rank died 0.5 s in.
    assert all((tmp_path / f"padding-{rank}-started").exists() for rank in range(3))
    assert not any((tmp_path / f"padding-{rank}-finished").exists() for rank in range(3))
    assert "epoch 0 failed" in job.stderr and "blacklisting h1" in job.stderr, job.stderr
    assert "epoch 1: 2 ranks on h0:1,h2:1" in job.stderr, job.stderr


def test_a_host_torn_down_below_min_np_waits_then_fails_saying_how_many(tmp_path: Path) -> None:
    with EmulatedHosts(hosts=2, slots=1) as cluster:
        torn: list[int] = []

        def schedule(commits: int, size: int) -> Sequence[str] | None:
            if commits >= 3 and not torn:
                torn.append(commits)
                _remove_namespace(cluster.namespaces[1])
                return ["h0"]
            return None

        job = run(tmp_path, cluster.hostnames, [*_across(cluster, 2, 2), "--elastic-timeout", "3"],
                  env={"ELASTIC_STEP_SECONDS": "0.1"}, schedule=schedule, timeout=150,
                  wrap=lambda cmd: cluster.exec_command(0, cmd))
    assert job.returncode == 1, job.stderr
    assert "waiting for hosts: 1 ranks available, 2 needed (--min-np 2)" in job.stderr, job.stderr
    assert "waited 3 s (--elastic-timeout) for hosts: 1 ranks available, 2 needed (--min-np 2)" in job.stderr
    assert job.results == []
