"""Elastic jobs on this machine: ranks killed or failing, hosts added and removed, too few hosts, limits.

Each job trains tests/elastic/_train.py (exact arithmetic) and checks the committed state bit for bit
against a replay of its own commit history, and that every sample index was processed exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ._harness import HOSTS, check_committed, run

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("failure", ["ELASTIC_KILL", "ELASTIC_RAISE"])
def test_a_failed_rank_leaves_the_survivors_going_on_from_the_last_commit(tmp_path: Path, failure: str) -> None:
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2"], env={failure: "2:1"})
    check_committed(job, samples=24, epochs=2, size=2)
    assert (tmp_path / f"{failure.lower()}-done").exists()
    assert "epoch 0 failed (exit status" in job.stderr and f"blacklisting {HOSTS[1]}" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert job.results[0]["resets"] == [2]  # the reset callbacks ran once, at size 2


def test_hosts_added_then_removed_by_discovery(tmp_path: Path) -> None:
    added: list[int] = []

    def schedule(commits: int, size: int) -> Sequence[str] | None:
        if size == 2 and commits >= 3 and not added:
            added.append(commits)
            return HOSTS
        if size == 3 and commits >= 9:
            return HOSTS[:1] + HOSTS[2:]  # 127.0.0.1 leaves gracefully
        return None

    job = run(tmp_path, HOSTS[:2], ["-np", "2", "--min-np", "2", "--max-np", "3"], schedule=schedule,
              env={"ELASTIC_SAMPLES": "36", "ELASTIC_STEP_SECONDS": "0.1"})
    check_committed(job, samples=36, epochs=2, size=2)
    assert job.stderr.count("committed and stopped for a change of hosts") == 2, job.stderr
    assert f"epoch 1: 3 ranks on {HOSTS[0]}:1,{HOSTS[1]}:1,{HOSTS[2]}:1" in job.stderr
    assert f"epoch 2: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert job.results[0]["resets"] == [2]  # each launch is a new process: its callbacks ran once
    assert "failed" not in job.stderr


def test_below_min_np_waits_then_fails_saying_how_many(tmp_path: Path) -> None:
    job = run(tmp_path, HOSTS[:2], ["-np", "2", "--min-np", "2", "--elastic-timeout", "2"],
              env={"ELASTIC_KILL": "2:1"})
    assert job.returncode == 1
    assert "waiting for hosts: 1 ranks available, 2 needed (--min-np 2)" in job.stderr
    assert ("waited 2 s (--elastic-timeout) for hosts: 1 ranks available, 2 needed (--min-np 2); "
            f"discovered: {HOSTS[0]}:1, {HOSTS[1]}:1; blacklisted: {HOSTS[1]}. Add hosts, or lower --min-np.") in job.stderr
    assert job.results == []


def test_reset_limit_stops_the_job(tmp_path: Path) -> None:
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2", "--reset-limit", "0"], env={"ELASTIC_KILL": "2:1"})
    assert job.returncode == 1
    assert "the job needs reset 1 (a rank failed), but --reset-limit is 0; stopping." in job.stderr
    assert "epoch 1" not in job.stderr


def test_every_host_blacklisted_stops_the_job(tmp_path: Path) -> None:
    job = run(tmp_path, HOSTS[:1], ["-np", "1", "--min-np", "1"], env={"ELASTIC_KILL": "2:0"})
    assert job.returncode == 1
    assert (f"every host the discovery script offers is blacklisted after failing ({HOSTS[0]}:1); 1 ranks "
            "needed") in job.stderr


def test_keras_job_with_the_elastic_callbacks_survives_a_kill(tmp_path: Path) -> None:
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2"], env={"ELASTIC_KILL": "5:1"},
              program=str(Path(__file__).with_name("_train_keras.py")))
    assert job.returncode == 0, job.stderr
    assert (tmp_path / "elastic_kill-done").exists() and "epoch 1: 2 ranks on" in job.stderr
    assert sorted(r["rank"] for r in job.results) == [0, 1]
    assert len({json.dumps([r["weights"], r["optimizer"], r["commits"]]) for r in job.results}) == 1
    assert {r["epoch"] for r in job.results} == {3}
    # 8 batches per epoch, a commit every 2 and at each epoch's end: 4 + 1 per epoch.
    assert job.results[0]["commits"] == 15
