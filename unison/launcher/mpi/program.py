"""Refuse a program that mpiexec could not start, before starting anything, and say how to run it.

mpiexec starts each rank with ``execvp``: a program named without a ``/`` is looked up on PATH only
(not in the current directory), a file needs its executable bit, and a script needs a ``#!`` line
(without one, a ``.py`` file would be read by ``/bin/sh``). mpiexec then reports only
``execvp error on file ...`` from every rank. The checks below run on the launcher's host; a program
that exists only on other hosts is left to mpiexec.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence

from ...errors import LaunchError

__all__ = ["check_program"]


def _fixes(np: int, program: Sequence[str]) -> str:
    script = program[0]
    return (f"Run it with the interpreter: unisonrun -np {np} python {shlex.join(program)}; or make it "
            f"executable with a first line naming its interpreter (#!/usr/bin/env python, then "
            f"chmod +x {shlex.quote(script)}) and run it as ./{os.path.basename(script)} or by its path.")


def check_program(np: int, program: Sequence[str], path: str | None = None) -> None:
    """Raise `LaunchError` if mpiexec would fail to start ``program[0]`` on this host.

    `path` is the PATH to search (default: this process's).

    Example:
        >>> check_program(2, ["python", "train.py"])
    """
    name = program[0]
    if "/" not in name:
        if shutil.which(name, path=path) is not None or not os.path.isfile(name):
            return  # found on PATH, or maybe on the other hosts only: mpiexec will tell
        raise LaunchError(
            f"{name!r} is a file in this directory, but mpiexec looks up a program named without a '/' "
            f"on PATH only, where there is no {name!r}. {_fixes(np, program)}"
        )
    if not os.path.exists(name):
        return
    if os.path.isdir(name):
        raise LaunchError(f"{name!r} is a directory, not a program. Give the program to run: "
                          f"unisonrun -np {np} python {shlex.quote(name)}/train.py")
    if not os.access(name, os.X_OK):
        raise LaunchError(f"{name!r} is not executable (mode {os.stat(name).st_mode & 0o777:o}), so mpiexec "
                          f"cannot start it. {_fixes(np, program)}")
    with open(name, "rb") as f:
        head = f.read(4)
    if name.endswith(".py") and not head.startswith(b"#!"):
        raise LaunchError(f"{name!r} has no '#!' first line, so it would run as a shell script, not "
                          f"Python. {_fixes(np, program)}")
