"""The job's private directory, and a reaper that stops the job and removes it if the launcher is killed.

The directory (mode 0700) holds the ranks' marker files, their output under ``--tag-output``, the
pickled calls of `unison.run`, and with the gRPC controller ``service.json``, the job's secret. The
launcher removes it when the job ends; a launcher killed with SIGKILL cannot. So `JobDirectory` also
starts a reaper: a small process in a session of its own that holds the read end of a pipe whose write
end only the launcher holds. When the launcher dies, however it dies, the kernel closes that end and
the reaper reads EOF: it kills every process whose environment carries this directory as
``UNISON_LAUNCHER_DIR`` (mpiexec, its local proxy, the ranks and their keepers, anything they started),
then removes the MPICH shared-memory segments they had mapped (``/dev/shm/mpich_shm_*``, read from
their ``/proc/PID/maps`` before the kill: ranks killed abruptly never unlink them), the directory and
the paths it was told of (the job's record for ``unisonrun --status``). The elastic driver's shared-memory store is such a directory too (under ``/dev/shm``,
marked in the ranks' environment by ``UNISON_ELASTIC_STORE``): its reaper kills every rank of every
epoch that could still write there, then removes it. When the job ends normally, the launcher removes the directory itself and tells the
reaper, which exits without touching anything. Ranks on other hosts end when their mpiexec proxy
loses its connection to mpiexec.

The reaper runs as ``python -I -S reaper.py FD DIRECTORY [VARIABLE]`` (this file, by its path): standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["JobDirectory", "job_processes"]

_LAUNCHER_DIR_VARIABLE = "UNISON_LAUNCHER_DIR"  # unison._job.failure.LAUNCHER_DIR_VARIABLE (stdlib only here)
_KILL_ROUNDS = 20  # a process may start another while the reaper kills: look again until none is left
SEGMENT_PREFIX = "/dev/shm/mpich_shm_"  # MPICH's shared memory between the ranks of a host


def job_processes(directory: str, variable: str = _LAUNCHER_DIR_VARIABLE) -> list[int]:
    """Pids of this user's processes whose environment sets `variable` (UNISON_LAUNCHER_DIR) to `directory`."""
    wanted = f"{variable}={directory}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # another user's process, or gone
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry))
    return found


def mapped_segments(pid: int) -> set[str]:
    """The MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) process `pid` has mapped, still linked."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if SEGMENT_PREFIX in line and not line.rstrip().endswith("(deleted)"):
                    path = line.split(maxsplit=5)[-1].strip()
                    if path.startswith(SEGMENT_PREFIX):
                        found.add(path)
    except OSError:  # gone, or another user's
        pass
    return found


def remove_segments(paths: set[str]) -> list[str]:
    """Unlink the segments in `paths` that still exist (their processes are gone); the ones removed."""
    removed = []
    for path in sorted(paths):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _reap(directory: str, removals: list[str], variable: str) -> None:
    segments: set[str] = set()
    for _ in range(_KILL_ROUNDS):
        pids = job_processes(directory, variable)
        if not pids:
            break
        for pid in pids:  # what the ranks mapped, read before they die: MPICH cannot unlink it then
            segments |= mapped_segments(pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    shutil.rmtree(directory, ignore_errors=True)
    remove_segments(segments)
    for path in removals:
        try:
            os.unlink(path)
        except OSError:
            pass


def _serve(fd: int, directory: str, variable: str = _LAUNCHER_DIR_VARIABLE) -> int:
    """Reaper main loop: read the launcher's lines until EOF; reap unless told the job is over."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's to handle
    removals: list[str] = []
    buffered = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(4096)
            if not chunk:
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                verb, _, argument = line.decode().partition(" ")
                if verb == "done":
                    return 0
                if verb == "remove":
                    removals.append(argument)
    _reap(directory, removals, variable)
    return 0


class JobDirectory:
    """A private temporary directory for one job, removed at the end even if the launcher is killed.

    Example:
        >>> with JobDirectory("unisonrun-") as job:     # doctest: +SKIP
        ...     job.remove_too(record)                   # also removed if the launcher dies
        ...     supervise(cmd, job.path, env)
    """

    def __init__(self, prefix: str, base: str | None = None, variable: str = _LAUNCHER_DIR_VARIABLE) -> None:
        """`base`: where to create it (default: the temporary directory); `variable`: the environment
        variable that marks the processes the reaper kills if the launcher dies."""
        self.prefix, self.base, self.variable = prefix, base, variable
        self.path = Path()
        self._write_fd = -1
        self._reaper: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = self._reaper.pid if self._reaper is not None else None
        return f"<JobDirectory path={str(self.path)!r} reaper_pid={pid}>"

    def __enter__(self) -> JobDirectory:
        self.path = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.base))
        read_fd, self._write_fd = os.pipe()  # both non-inheritable: mpiexec and the ranks never hold them
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_fd), str(self.path),
                 self.variable],
                pass_fds=(read_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)
        except BaseException:
            os.close(self._write_fd)
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        finally:
            os.close(read_fd)
        return self

    def remove_too(self, path: Path | None) -> None:
        """Have the reaper also remove `path` if the launcher dies."""
        if path is not None:
            self._tell(f"remove {path}")

    def _tell(self, line: str) -> None:
        try:
            os.write(self._write_fd, (line + "\n").encode())
        except OSError:
            pass  # the reaper is gone: nothing to tell

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._tell("done")
        os.close(self._write_fd)
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4]))
