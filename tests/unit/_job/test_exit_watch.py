"""The exit watcher of a rank under plain mpiexec: silent once settled, one line when the rank ends
without a word (a real child process ends each way; the watcher's output is read from its stderr)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

PROGRAM = """
import os, sys
from unison._job.exit_watch import ExitWatch
watch = ExitWatch.start("unison: rank 3 ended without a word")
if sys.argv[1] == "settle":
    watch.settle()
    watch.settle()  # twice is harmless
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        watch.forget_in_child()
        os._exit(0)
    os.waitpid(pid, 0)
    watch.settle()
os._exit(0)
"""


@pytest.mark.parametrize(("how", "said"), [("settle", False), ("fork", False), ("silent", True)])
def test_the_watcher_speaks_only_when_the_rank_ends_without_a_word(how: str, said: bool) -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM, how], stderr=subprocess.PIPE, timeout=30)
    # the watcher holds the same stderr: reading it to the end waits for the watcher too
    assert (b"unison: rank 3 ended without a word\n" in done.stderr) == said, done.stderr
    assert done.stderr.count(b"ended without") <= 1, done.stderr


def test_the_line_names_the_rank_and_what_to_use() -> None:
    from unison._job.exit_watch import watcher_text

    text = watcher_text(1, "node7", 4242)
    assert text.startswith("unison: rank 1 (node7, pid 4242) ended without shutting unison down")
    assert "unisonrun" in text and "os._exit(0)" in text
