"""Say when a rank under plain mpiexec ends without a word: a watcher process outside the rank.

Under unisonrun each rank's keeper sees how it ended. Under plain mpiexec nothing does: a rank that
ends with ``os._exit(0)`` mid-run makes MPICH kill the others and exit 0, so the job reports success
after doing part of its work, and a rank killed by a signal leaves only MPICH's banner. At ``init()``
such a rank starts a small watcher in a session of its own that holds the read end of a pipe; the
rank tells it (`ExitWatch.settle`) when it shuts unison down or reports its own end (an error, an
abort, the stop of the job). When the pipe closes without that word, the rank ended some other way,
and the watcher prints so on the rank's stderr, which mpiexec shows.
"""

from __future__ import annotations

import subprocess
import sys
import threading

__all__ = ["ExitWatch", "watcher_text"]

# Reads one byte: any byte means the rank settled; end of file means it ended without a word.
_WATCHER = """
import os, sys
try:
    told = os.read(0, 1)
except OSError:
    told = b""
if not told:
    os.write(2, sys.argv[1].encode(errors="replace") + b"\\n")
"""


def watcher_text(rank: int, host: str, pid: int) -> str:
    """The line the watcher prints when the rank ends without a word."""
    return (f"unison: rank {rank} ({host}, pid {pid}) ended without shutting unison down and without "
            "reporting an error, while the job was running (os._exit, a signal, or mpiexec stopping it "
            "after another rank ended). Under plain mpiexec the job's exit status may not show it (an "
            "os._exit(0) ends the job with 0): unisonrun names the rank that ended first and exits with "
            "its status (docs/launcher.md, \"Exit status\").")


class ExitWatch:
    """The rank's side of the watcher: start it, then `settle` it once the rank's end is accounted for.

    Example:
        >>> watch = ExitWatch.start("unison: rank 1 ended without a word")   # doctest: +SKIP
        >>> watch.settle()                                                     # doctest: +SKIP
    """

    def __init__(self, process: subprocess.Popen[bytes] | None) -> None:
        self._process = process
        self._lock = threading.Lock()
        self.settled = process is None

    def __repr__(self) -> str:
        pid = self._process.pid if self._process is not None else None
        return f"<ExitWatch pid={pid} settled={self.settled}>"

    @classmethod
    def start(cls, text: str) -> ExitWatch:
        """Start the watcher; without one (no process could start) the rank goes unwatched, as before."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHER, text], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        except OSError:
            return cls(None)
        return cls(process)

    def settle(self) -> None:
        """The rank's end is accounted for (shut down, or reported): the watcher leaves without a word."""
        with self._lock:
            if self.settled or self._process is None or self._process.stdin is None:
                return
            self.settled = True
            try:
                self._process.stdin.write(b"s")
                self._process.stdin.close()
            except OSError:  # the watcher is gone (killed with the session): nothing to tell
                pass

    def forget_in_child(self) -> None:
        """In a child forked from the rank: close its copy of the write end without telling the watcher
        (nothing was written to it, so closing writes nothing), so the rank's own end is still seen."""
        if self._process is not None and self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        self.settled = True
