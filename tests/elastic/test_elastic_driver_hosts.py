"""The elastic driver's blacklist over a real job: a failed host returns when its cooldown ends.

Each job trains tests/elastic/_train.py on names of this machine as hosts (`_harness`) and checks the
committed state bit for bit against a replay of its commit history.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._harness import HOSTS, check_committed, run

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(150)]

COOLDOWN = ["--blacklist-cooldown-range", "2", "2"]


def test_a_failed_host_rejoins_the_job_after_its_cooldown(tmp_path: Path) -> None:
    # Rank 1 (on HOSTS[1]) dies at commit 2; its host sits out 2 s, then discovery (which lists it
    # throughout) offers it again: the ranks commit, stop, and the job relaunches on all three.
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2", "--max-np", "3", *COOLDOWN],
              env={"ELASTIC_KILL": "2:1", "ELASTIC_SAMPLES": "48", "ELASTIC_STEP_SECONDS": "0.1"}, timeout=130)
    check_committed(job, samples=48, epochs=2, size=3)
    everyone = ",".join(f"{h}:1" for h in HOSTS)
    assert f"epoch 0: 3 ranks on {everyone}" in job.stderr, job.stderr
    assert re.search(rf"epoch 0 failed \(exit status \d+\); blacklisting {re.escape(HOSTS[1])} for 2\.0 s "
                     r"\(failure 1 of this host; --blacklist-cooldown-range backs off\) \(rank 1 failed\)",
                     job.stderr), job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert "epoch 1 committed and stopped for a change of hosts" in job.stderr
    # The survivors keep their places; the host back from its cooldown comes last.
    assert f"epoch 2: 3 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1,{HOSTS[1]}:1" in job.stderr
    assert {r["last_epoch"] for r in job.results} == {2}
    assert {r["epoch"] for r in job.results} == {0, 2}  # the survivors kept their processes of epoch 0


def test_too_few_hosts_wait_for_a_cooldown_to_end_then_go_on(tmp_path: Path) -> None:
    # Two hosts, --min-np 2: after the failure only one is usable, so the driver waits; when the
    # cooldown ends the failed host is usable again and the job resumes from its last commit on both.
    job = run(tmp_path, HOSTS[:2], ["-np", "2", "--min-np", "2", "--elastic-timeout", "60", *COOLDOWN],
              env={"ELASTIC_KILL": "2:1"}, timeout=130)
    check_committed(job, samples=24, epochs=2, size=2)
    assert "waiting for hosts: 1 ranks available, 2 needed (--min-np 2)" in job.stderr, job.stderr
    assert f"blacklisted: {HOSTS[1]}" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[1]}:1" in job.stderr
    assert {r["last_epoch"] for r in job.results} == {1}
    assert {r["epoch"] for r in job.results} == {0, 1}  # the survivor kept its process of epoch 0
