"""Faults while an elastic job re-forms in place, sent from outside: a second rank lost, discovery failing, a
survivor frozen. Each ends as a failure of the running job does: the rank named, its host blacklisted, the job
going on from the last commit on the hosts left, within the bounds that apply.

Names of this machine stand for hosts (`_harness`); a fourth name, ``localhost.localdomain``, gives a job of
three ranks a spare host, so that the epoch after a failure waits for a new worker to start (a few seconds:
Python, torch and unison imported) while the survivors have re-formed: that is when the faults are sent.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest

from ._harness import HOSTS, check_committed, run

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(150)]

FOUR = (*HOSTS, "localhost.localdomain")


def _pid(out: Path, launch: int, rank: int) -> int:
    return int((out / f"pid-{launch}-{rank}").read_text())


class _Trigger:
    """Acts once on the first line of unisonrun's output that contains `text`."""

    def __init__(self, text: str, act: object) -> None:
        self.text, self.act, self.fired = text, act, threading.Event()

    def __call__(self, line: str) -> None:
        if self.text in line and not self.fired.is_set():
            self.fired.set()
            assert callable(self.act)
            self.act()


def test_a_second_rank_lost_while_the_job_reforms(tmp_path: Path) -> None:
    # Rank 2 (FOUR[2]) kills itself; while epoch 1 waits for the new worker on FOUR[3], rank 1's process
    # (FOUR[1]) is SIGKILLed from outside. Both are named and blacklisted; rank 0's process and the new
    # worker go on from the last commit.
    trigger = _Trigger("epoch 1: 3 ranks on", lambda: os.kill(_pid(tmp_path, 0, 1), signal.SIGKILL))
    job = run(tmp_path, FOUR, ["-np", "3", "--min-np", "1", "--max-np", "3"],
              env={"ELASTIC_KILL": "2:2", "ELASTIC_SAMPLES": "36"}, on_line=trigger, timeout=120)
    assert trigger.fired.is_set(), job.stderr
    check_committed(job, samples=36, epochs=2, size=2)
    a, b, c, d = FOUR
    assert f"epoch 0 failed (exit status 137); blacklisting {c} for good (rank 2 failed)" in job.stderr, job.stderr
    assert re.search(rf"rank 1 \({re.escape(b)}, pid \d+\) ended without shutting unison down \(killed by signal 9",
                     job.stderr), job.stderr
    assert f"epoch 1 failed (exit status 137); blacklisting {b} for good (rank 1 failed)" in job.stderr, job.stderr
    assert f"epoch 2: 2 ranks on {a}:1,{d}:1" in job.stderr, job.stderr
    assert job.results[0]["pid"] == _pid(tmp_path, 0, 0)  # rank 0 kept its process through both
    assert len(list(tmp_path.glob("pid-*"))) == 4  # three at the start, one new worker


def test_discovery_failing_while_the_job_reforms_keeps_the_hosts_it_printed_last(tmp_path: Path) -> None:
    # The discovery script fails (its file is gone) from the first commit on; rank 1 is lost later, and
    # the job re-forms on the hosts discovery printed last, less the failed one.
    def schedule(commits: int, size: int) -> None:
        if commits >= 1:
            (tmp_path / "hosts").unlink(missing_ok=True)

    job = run(tmp_path, HOSTS, ["-np", "2", "--min-np", "1", "--max-np", "2"],
              env={"ELASTIC_KILL": "4:1"}, schedule=schedule)
    check_committed(job, samples=24, epochs=2, size=2)
    assert "the host discovery script exited with status 1" in job.stderr, job.stderr
    assert "(keeping the hosts it printed last)" in job.stderr
    assert f"epoch 1: 2 ranks on {HOSTS[0]}:1,{HOSTS[2]}:1" in job.stderr, job.stderr
    assert job.stderr.count("the host discovery script exited") == 1  # said once, not at every poll


def test_a_survivor_frozen_while_the_job_reforms_is_named_and_stopped(tmp_path: Path) -> None:
    # Rank 2 kills itself; while epoch 1 waits for its new worker, rank 1's process is stopped (SIGSTOP)
    # from outside. It never joins (or never meets its peers): within UNISON_START_TIMEOUT_SECONDS the
    # driver names it as frozen, kills it and blacklists its host; the job goes on without it. The bound
    # also holds the first epoch's workers to joining in time, which includes importing torch: 20 s, as
    # a busy machine (load 15 on its 2 cores) took more than 8 s for that.
    trigger = _Trigger("epoch 1: 3 ranks on", lambda: os.kill(_pid(tmp_path, 0, 1), signal.SIGSTOP))
    job = run(tmp_path, FOUR, ["-np", "3", "--min-np", "1", "--max-np", "3"],
              env={"ELASTIC_KILL": "2:2", "ELASTIC_SAMPLES": "36", "UNISON_START_TIMEOUT_SECONDS": "20"},
              on_line=trigger, timeout=120)
    assert trigger.fired.is_set(), job.stderr
    check_committed(job, samples=36, epochs=2, size=2)
    a, b, _, d = FOUR
    named = re.search(rf"unisonrun: rank 1 \({re.escape(b)}, pid (\d+)\) (did not join epoch 1 within 20 s|stopped "
                      r"answering)", job.stderr)
    assert named and int(named.group(1)) == _pid(tmp_path, 0, 1), job.stderr
    assert f"blacklisting {b} for good" in job.stderr, job.stderr
    assert f"epoch 2: 2 ranks on {a}:1,{d}:1" in job.stderr, job.stderr
