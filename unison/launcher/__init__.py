"""Launching unison jobs: the `unisonrun` command and `run(func, num_proc=N)` for a function on N local processes."""

from ._cli import main
from ._run import run

__all__ = ["main", "run"]
