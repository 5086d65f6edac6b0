"""Elastic jobs whose program fails every time it starts end with a clear error instead of relaunching forever.

Three names of this machine stand for three hosts (tests/elastic/_harness.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._harness import HOSTS

pytestmark = pytest.mark.timeout(120)

PYTHON = sys.executable

# `raise`: an uncaught exception after init() (named, so its host is blacklisted); `exit`: an orderly
# shutdown and then exit status 3 (no rank can be named for it).
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
    assert done.returncode == 1
    assert "ValueError: rank 0 cannot start" in done.stderr
    # Each launch names its one rank and blacklists its host, until the third failure in a row
    # without a commit stops the job.
    assert done.stderr.count("unisonrun: rank 0 (") == 3, done.stderr
    assert f"epoch 0 failed (exit status 1); blacklisting {HOSTS[0]} for good (rank 0 failed)" in done.stderr
    assert "3 launches in a row failed before their first commit; stopping" in done.stderr
    assert "epoch 3" not in done.stderr


def test_failures_that_name_no_rank_stop_after_three_launches(tmp_path: Path) -> None:
    done = _run(tmp_path, 2, "exit")
    assert done.returncode == 1, done.stderr
    assert "blacklisting" not in done.stderr  # nothing to blame: the same hosts every time
    assert [line for line in done.stderr.splitlines() if " failed (exit status 3)" in line] == [
        f"unisonrun: elastic: epoch {n} failed (exit status 3)" for n in range(3)], done.stderr
    assert done.stderr.rstrip().endswith(
        "3 launches in a row failed before their first commit; stopping instead of launching again. The "
        "ranks' output above says why: a program that fails every time it starts needs fixing, not "
        "relaunching."), done.stderr
