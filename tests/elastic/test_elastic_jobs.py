"""Elastic jobs on this machine: ranks killed or failing, hosts added and removed, too few hosts, limits.

Each job trains tests/elastic/_train.py (exact arithmetic) and checks the committed state bit for bit
against a replay of its own commit history, and that every sample index was processed exactly once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from . import _train
from ._harness import HOSTS, check_committed, run

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(120)]


def _pids(out: Path) -> dict[str, int]:
    """The processes the job started: ``<epoch started in>-<rank then>`` -> pid."""
    return {p.name.removeprefix("pid-"): int(p.read_text()) for p in out.glob("pid-*")}


@pytest.mark.parametrize("failure", ["ELASTIC_KILL", "ELASTIC_RAISE"])
def test_a_failed_rank_leaves_the_survivors_going_on_from_the_last_commit(tmp_path: Path, failure: str) -> None:
    # Every rank's finally: block takes 3 s. The survivors keep their processes (and their finally:
    # blocks run once, at the end); the failed rank's host is blacklisted, a new worker takes its
    # place on the third host and receives the committed state. The rank that raises runs its own
    # finally: before its exception is uncaught, which is when the failure is known.
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2", "--max-np", "2"],
              env={failure: "2:1", "ELASTIC_FINALLY_SECONDS": "3"})
    check_committed(job, samples=24, epochs=2, size=2)
    assert (tmp_path / f"{failure.lower()}-done").exists()
    assert "epoch 0 failed (exit status" in job.stderr and f"blacklisting {HOSTS[1]}" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    pids = _pids(tmp_path)
    assert sorted(pids) == ["0-0", "0-1", "1-1"], pids  # three processes in all: the survivor was not restarted
    survivor, newcomer = job.results
    assert survivor["pid"] == pids["0-0"] and newcomer["pid"] == pids["1-1"]
    # the workers' idle OpenMP threads sleep instead of spinning (they took the cores gloo needs)
    assert survivor["omp_wait_policy"] == newcomer["omp_wait_policy"] == "passive"
    assert survivor["resets"] == newcomer["resets"] == [2]  # the reset callbacks ran once, at size 2
    ran = ["finally-0-0", "finally-1-1"] + (["finally-0-1"] if failure == "ELASTIC_RAISE" else [])
    assert sorted(p.name for p in tmp_path.glob("finally-*")) == sorted(ran)  # the raising rank runs its own
    assert not list(tmp_path.glob("segments-*")) or all(not p.read_text() for p in tmp_path.glob("segments-*"))


@pytest.mark.parametrize("failure", ["ELASTIC_KILL", "ELASTIC_RAISE"])
def test_a_relaunched_job_goes_on_from_the_last_commit(tmp_path: Path, failure: str) -> None:
    # --elastic-relaunch: one mpiexec launch per epoch. The failed launch is stopped as soon as the
    # failure is known, so the next one starts without waiting for the survivor's finally: block (it
    # never finishes).
    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "2", "--elastic-relaunch"],
              env={failure: "2:1", "ELASTIC_FINALLY_SECONDS": "3"})
    check_committed(job, samples=24, epochs=2, size=2)
    assert (tmp_path / f"{failure.lower()}-done").exists()
    assert "epoch 0 failed (exit status" in job.stderr and f"blacklisting {HOSTS[1]}" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert job.results[0]["resets"] == [2]  # the reset callbacks ran once, at size 2
    assert not (tmp_path / "finally-0-0").exists()  # the failed launch's survivor was stopped at once
    assert sorted(p.name for p in tmp_path.glob("finally-1-*")) == ["finally-1-0", "finally-1-1"]
    assert sorted(_pids(tmp_path)) == ["0-0", "0-1", "0-2", "1-0", "1-1"]  # every process anew
    # MPICH's shared memory of both launches is gone, the failed one's too (its ranks never finalized).
    segments = [line for p in tmp_path.glob("segments-*") for line in p.read_text().split()]
    assert segments and not [path for path in segments if os.path.exists(path)], segments


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
              env={"ELASTIC_SAMPLES": "36", "ELASTIC_STEP_SECONDS": "0.1", "OMP_WAIT_POLICY": "active"})
    check_committed(job, samples=36, epochs=2, size=2)
    assert {r["omp_wait_policy"] for r in job.results} == {"active"}  # the job's own setting stays
    assert job.stderr.count("committed and stopped for a change of hosts") == 2, job.stderr
    assert f"epoch 1: 3 ranks on {HOSTS[0]}:1,{HOSTS[1]}:1,{HOSTS[2]}:1" in job.stderr
    assert f"epoch 2: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr
    assert job.results[0]["resets"] == [3, 2]  # rank 0 kept its process: its callbacks ran at each reset
    assert len(_pids(tmp_path)) == 3  # the third host's worker joined, then left; no process restarted
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


def test_a_horovod_style_script_keeps_its_own_values_and_loses_no_commit(tmp_path: Path) -> None:
    # The script keeps a `commits` counter of its own (counting down), a batch index that goes on
    # across resets (what record_batch gets), and a value of every name the State once used for its
    # own bookkeeping. 127.0.0.1 leaves after a few steps (its store keeps that commit) and comes back
    # later in the same epoch: the launch it joins must start from the newest commit, not from its
    # older one, and the batches recorded after the first change (their index went on past what
    # the new launch dealt) must count, or the second change would deal them out again.
    a, b, c = HOSTS
    changes: list[int] = []

    def schedule(steps: int, size: int) -> Sequence[str] | None:
        if not changes and size == 2 and steps >= 3:
            changes.append(steps)
            return [a, c]
        if len(changes) == 1 and steps >= changes[0] + 4:
            changes.append(steps)
            return [a, c, b]
        return None

    job = run(tmp_path, [a, b], ["-np", "2", "--min-np", "2", "--max-np", "3"], schedule=schedule,
              env={"ELASTIC_HOROVOD_STYLE": "1", "ELASTIC_SAMPLES": "48", "ELASTIC_STEP_SECONDS": "0.1"})
    check_committed(job, samples=48, epochs=2, size=3)
    assert f"epoch 1: 2 ranks on {a}:1,{c}:1" in job.stderr and f"epoch 2: 3 ranks on {a}:1,{c}:1,{b}:1" in job.stderr
    for launch in (1, 2):  # each launch went on from the last commit of the one before (or one after it:
        # the commit that stopped the launch for the change of hosts is never logged)
        restored = int((tmp_path / f"restored-{launch}").read_text())
        assert restored - int((tmp_path / f"committed-{launch - 1}").read_text()) in (0, 1), launch
    steps = len(job.results[0]["history"])  # type: ignore[arg-type]
    for result in job.results:
        values = result["values"]
        assert isinstance(values, dict)
        assert values.pop("commits") == 1000 - steps and values.pop("batch") == 0
        assert values == {name: [name, steps] for name in _train.FORMER_INTERNAL_NAMES[1:]}
    assert job.results[0]["commits"] == steps + 2  # unison's own count: a commit each step and each epoch's end
