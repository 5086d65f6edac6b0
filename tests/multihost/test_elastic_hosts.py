"""An elastic job across emulated hosts: 2 hosts, a third added by discovery, then one torn down.

The discovery schedule grows the job from h0, h1 to h0, h1, h2 (a commit and a relaunch), then tears
down h1's network namespace with its ranks in it (a host vanishing: a failure and a relaunch on h0,
h2). The committed state must equal a replay of its commit history bit for bit, on every rank, with
every sample index processed exactly once per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from unison.testing.hosts import EmulatedHosts, _remove_namespace, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(180),
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
    assert job.stderr.rstrip().splitlines()[-1].endswith(": 2 ranks on h0:1,h2:1"), job.stderr
