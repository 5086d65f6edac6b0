"""Elastic jobs whose program fails every time end with a clear error instead of relaunching forever.

Names of this machine stand for hosts (tests/elastic/_harness.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._harness import HOSTS

pytestmark = pytest.mark.timeout(120)

PYTHON = sys.executable

# `raise`: an uncaught exception after init() (named, so its host is blacklisted); `exit`: an orderly
# shutdown and then exit status 3 (the launcher names the rank that exited so first, as any rank that
# ends with its own non-zero status, and blacklists its host).
PROGRAM = """\
import sys
import unison
unison.init()
if sys.argv[1] == "raise":
    raise ValueError(f"rank {unison.rank()} cannot start")
unison.shutdown()
sys.exit(3)
"""


def _run(tmp_path: Path, np: int, how: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "hosts").write_text("".join(f"{h}:1\n" for h in HOSTS))
    (tmp_path / "program.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    return subprocess.run([PYTHON, "-m", "unison.launcher", "-np", str(np), "--min-np", "1", "--max-np", str(np),
                           "--host-discovery-script", f"cat {tmp_path / 'hosts'}", "--discovery-interval", "0.2",
                           PYTHON, str(tmp_path / "program.py"), how],
                          capture_output=True, text=True, timeout=100, env=env)


def test_a_single_rank_that_raises_is_named_and_its_host_blacklisted(tmp_path: Path) -> None:
    done = _run(tmp_path, 1, "raise")
    assert done.returncode == 1, done.stderr
    assert "ValueError: rank 0 cannot start" in done.stderr
    # Each launch names its one rank (by the elastic host it ran as) and blacklists its host, until
    # the third failure alike on a third host stops the job: the program, not the hosts.
    named = re.findall(r"^unisonrun: rank 0 \((\S+), pid \d+\) failed", done.stderr, re.MULTILINE)
    assert named == list(HOSTS), done.stderr
    assert done.stderr.count("unisonrun: rank 0 (") == 3, done.stderr
    assert f"epoch 0 failed (exit status 1); blacklisting {HOSTS[0]} for good (rank 0 failed)" in done.stderr, \
        done.stderr
    assert ("3 launches in a row failed with the same error (ValueError at program.py:5 in <module>) on 3 "
            "different hosts") in done.stderr, done.stderr
    assert "epoch 3" not in done.stderr, done.stderr


def test_failures_that_name_no_rank_stop_after_three_launches(tmp_path: Path) -> None:
    done = _run(tmp_path, 2, "exit")
    assert done.returncode == 1, done.stderr
    assert len(re.findall(r"^unisonrun: rank \d \(\S+, pid \d+\) exited with status 3 after shutting unison down\.$",
                          done.stderr, re.MULTILINE)) == 3, done.stderr
    assert [line.split(";")[0] for line in done.stderr.splitlines() if " failed (exit status 3)" in line] == [
        f"unisonrun: elastic: epoch {n} failed (exit status 3)" for n in range(3)], done.stderr
    assert done.stderr.rstrip().endswith(
        "3 launches in a row failed before their first commit; stopping instead of launching again. The "
        "ranks' output above says why: a program that fails every time it starts needs fixing, not "
        "relaunching."), done.stderr


# Commits, then raises the same error at the same line in every launch (the step in the message differs).
DETERMINISTIC = """\
import unison.torch as hvd
hvd.init()
state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)


@hvd.elastic.run
def train(state):
    while True:
        state.step += 1
        state.commit()
        if state.step >= 2:
            raise ValueError(f"step {state.step} cannot be done")


train(state)
"""


def test_the_same_error_on_every_host_is_called_the_programs_and_failed_hosts_back_off(tmp_path: Path) -> None:
    # Two hosts of one slot, one rank: the error burns localhost, then 127.0.0.1, then localhost again
    # once its cooldown (0.3 * 2 s plus jitter) is over, for twice as long; the third failure alike
    # stops the job. Each failure names the elastic host the rank ran as, not this machine's name.
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    (tmp_path / "program.py").write_text(DETERMINISTIC)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    done = subprocess.run([PYTHON, "-m", "unison.launcher", "-np", "1", "--max-np", "1",
                           "--blacklist-cooldown-range", "0.3", "30", "--host-discovery-script",
                           f"cat {tmp_path / 'hosts'}", "--discovery-interval", "0.1", PYTHON,
                           str(tmp_path / "program.py")], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 1, done.stderr
    named = [line for line in done.stderr.splitlines() if line.startswith("unisonrun: rank 0 (")]
    assert [line.split(",")[0] for line in named] == [
        "unisonrun: rank 0 (localhost", "unisonrun: rank 0 (127.0.0.1", "unisonrun: rank 0 (localhost"], done.stderr
    assert "failed: ValueError: step 2 cannot be done at program.py:12 in train" in named[0], named
    cooldowns = [float(m) for m in re.findall(r"for ([\d.]+) s \(failure (?:1|2) of this host;", done.stderr)]
    failures = re.findall(r"\(failure (\d) of this host;", done.stderr)
    assert failures == ["1", "1", "2"], done.stderr
    assert 0.6 <= cooldowns[0] <= 0.9 and 0.6 <= cooldowns[1] <= 0.9 and 1.2 <= cooldowns[2] <= 1.5, cooldowns  # 0.1 s steps
    assert done.stderr.rstrip().endswith(
        "unisonrun: elastic: 3 launches in a row failed with the same error (ValueError at program.py:12 in "
        "train) on 2 different hosts (127.0.0.1, localhost): that is the program, not the hosts. Fix the error "
        "(its traceback is above); relaunching would only blacklist more hosts. Stopping."), done.stderr


RANK_ONE_RAISES = """\
import logging
import numpy as np
import unison
unison.init()
logging.getLogger("unison").warning("started")
unison.allreduce(np.ones(2), name="started")
if unison.rank() == 1:
    raise ValueError("rank 1 cannot go on")
unison.allreduce(np.ones(2), name="x")
"""


def test_the_ranks_own_lines_name_the_elastic_host_they_run_as(tmp_path: Path) -> None:
    """Two elastic hosts that are both this machine: every line naming the failed rank (the ranks' log
    lines and unisonrun's) says 127.0.0.1, the host it ran as, never the machine's name."""
    import socket

    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    (tmp_path / "program.py").write_text(RANK_ONE_RAISES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    done = subprocess.run([PYTHON, "-m", "unison.launcher", "-np", "2", "--min-np", "1", "--max-np", "2",
                           "--host-discovery-script", f"cat {tmp_path / 'hosts'}", "--discovery-interval", "0.2",
                           PYTHON, str(tmp_path / "program.py")], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr  # the second launch, on localhost alone, finishes
    named = re.findall(r"rank 1 \((\S+), pid \d+\) failed", done.stderr)
    assert named and set(named) == {"127.0.0.1"}, done.stderr  # unisonrun's line, and the ranks' if they got to it
    assert "[unison rank 1/2 127.0.0.1] WARNING started" in done.stderr, done.stderr
    assert "[unison rank 0/2 localhost] WARNING started" in done.stderr, done.stderr
    assert f"({socket.gethostname()}, pid" not in done.stderr
