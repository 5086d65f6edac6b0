"""Each rank's stacks on request: SIGUSR2 makes a rank started by unisonrun write every thread's stack.

`unisonrun --status` sends SIGUSR2 to the job's ranks on its host (`unison.launcher.stacks`). A rank
whose launcher directory is on this host answers through `faulthandler`, which writes from its C
signal handler, so the answer comes even while the main thread is stuck in C code holding the GIL:
every thread's stack, innermost frame first, appended to ``stacks-<rank>.txt`` in that directory,
after a first line that names the main thread (``main thread 0x...``). Nothing is armed when the
program handles SIGUSR2 itself, or outside unisonrun.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from pathlib import Path
from typing import IO

__all__ = ["MAIN_THREAD_HEADER", "SIGNAL", "arm", "disarm", "file_name"]

SIGNAL = signal.SIGUSR2
MAIN_THREAD_HEADER = "main thread "  # the file's first line: "main thread 0x00007f..."
_armed: list[IO[str]] = []  # the open file faulthandler writes to (it keeps the descriptor)


def file_name(rank: int) -> str:
    """The file `rank` writes its stacks to.

    Example:
        >>> file_name(2)
        'stacks-2.txt'
    """
    return f"stacks-{rank}.txt"


def arm(directory: Path | None, rank: int) -> None:
    """Make SIGUSR2 write this process's stacks to `directory`/``stacks-<rank>.txt`` (once per process)."""
    if directory is None or _armed or signal.getsignal(SIGNAL) is not signal.SIG_DFL:
        return
    try:
        descriptor = os.open(directory / file_name(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                             0o600)
        stream = os.fdopen(descriptor, "a")
        stream.write(f"{MAIN_THREAD_HEADER}0x{threading.main_thread().ident or 0:016x}\n")
        stream.flush()
        faulthandler.register(SIGNAL, file=stream, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        return  # stacks on request are a convenience: the job goes on without them
    _armed.append(stream)


def disarm() -> None:
    """Give SIGUSR2 back its default action and close the file."""
    if not _armed:
        return
    with contextlib.suppress(RuntimeError, ValueError):
        faulthandler.unregister(SIGNAL)
    with contextlib.suppress(OSError):
        _armed.pop().close()
