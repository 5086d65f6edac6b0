"""Run one mpiexec job and make sure it ends: watch the ranks, name the one that failed, kill strays.

Every rank started under the launcher writes marker files into the job's directory (see
`unison._failure`): ``started-R`` (host and pid, at ``init()``), ``failed-R`` (the abort reason, from
the exception hook) and ``finished-R`` (at an orderly ``shutdown()``). The supervisor polls them with
mpiexec: a rank on this host whose pid is gone without ``finished-R`` died (signal, ``os._exit``); a
``failed-R`` means an uncaught exception. After either, the job gets `GRACE_SECONDS` to end by itself
(the abort normally ends it in under a second), then everything is killed. mpiexec starts each rank in
its own session, so killing mpiexec's process group is not enough: the registered pids are killed too.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._failure import GRACE_SECONDS as RANK_GRACE_SECONDS

__all__ = ["GRACE_SECONDS", "JobOutcome", "supervise"]

GRACE_SECONDS = RANK_GRACE_SECONDS + 2.0  # ranks hard-exit 5 s after an abort; kill at 7 s
INTERRUPT_GRACE_SECONDS = 3.0
_POLL_SECONDS = 0.01


@dataclasses.dataclass
class JobOutcome:
    """How a supervised job ended."""

    returncode: int
    failures: dict[int, str]  # rank -> why (first failure first)
    interrupted: bool = False
    timed_out: bool = False
    killed: list[int] = dataclasses.field(default_factory=list)  # pids killed after the job

    def summary(self) -> str:
        """One line per failed rank, or '' when the job succeeded."""
        lines = [f"unisonrun: {why}" for why in self.failures.values()]
        if self.interrupted:
            lines.append("unisonrun: interrupted; stopped every rank.")
        if self.timed_out:
            lines.append("unisonrun: the job ran past --timeout; stopped every rank.")
        if not lines and self.returncode != 0:
            lines.append(f"unisonrun: the job failed with exit status {self.returncode}; see the ranks' "
                         "output above.")
        return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _markers(directory: Path) -> tuple[dict[int, tuple[str, int]], dict[int, str], set[int]]:
    started: dict[int, tuple[str, int]] = {}
    failed: dict[int, str] = {}
    finished: set[int] = set()
    try:
        names = os.listdir(directory)
    except OSError:
        return started, failed, finished
    for name in names:
        kind, _, rank_text = name.partition("-")
        if not rank_text.isdigit():
            continue
        rank = int(rank_text)
        if kind == "finished":
            finished.add(rank)
            continue
        try:
            text = (directory / name).read_text().strip()
        except OSError:
            continue
        if kind == "started":
            host, _, pid = text.partition(" ")
            if pid.isdigit():
                started[rank] = (host, int(pid))
        elif kind == "failed":
            failed[rank] = text
    return started, failed, finished


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(cmd: Sequence[str], directory: Path, env: Mapping[str, str], *,
              timeout: float | None = None, stdout: int | None = None,
              tails: tuple[int, str] | None = None) -> JobOutcome:
    """Run `cmd` (an mpiexec command line) until it ends, ending it when a rank fails.

    SIGINT and SIGTERM received meanwhile are forwarded to mpiexec; ranks still alive
    `INTERRUPT_GRACE_SECONDS` later are killed.
    """
    host = socket.gethostname()
    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True, stdout=stdout)
    interrupted: list[int] = []
    previous = {}

    def on_signal(signum: int, frame: object) -> None:
        interrupted.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (unison.run from a thread): no forwarding
            pass
    tailer = _Tailer(*tails) if tails else None
    start = time.monotonic()
    failures: dict[int, str] = {}
    first_failure: float | None = None
    stop_at: float | None = None
    forwarded = False
    outcome = JobOutcome(0, failures)
    started: dict[int, tuple[str, int]] = {}
    try:
        while True:
            rc = proc.poll()
            if tailer is not None:
                tailer.pump()
            started, failed, finished = _markers(directory)
            now = time.monotonic()
            for rank in sorted(failed):
                if rank not in failures:
                    failures[rank] = failed[rank]
            vanished = [
                rank for rank, (rank_host, pid) in sorted(started.items())
                if rank_host == host and rank not in finished and rank not in failed and not _alive(pid)
            ]
            if vanished and not failures:
                # Ranks seen gone in the same poll cannot be told apart: mpiexec may already have
                # killed the others because of the first.
                names = ", ".join(f"rank {r} ({started[r][0]}, pid {started[r][1]})" for r in vanished)
                failures[vanished[0]] = (
                    f"{names} ended without shutting unison down (killed by a signal, or os._exit) while "
                    "the job was running" + ("; mpiexec may have killed all but the first of them."
                                             if len(vanished) > 1 else ".")
                )
            if failures and first_failure is None:
                first_failure = now
                stop_at = now + GRACE_SECONDS
            if interrupted and not forwarded:
                forwarded = True
                outcome.interrupted = True
                try:
                    proc.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass
                stop_at = min(stop_at or float("inf"), now + INTERRUPT_GRACE_SECONDS)
            if timeout is not None and now - start > timeout and stop_at is None:
                outcome.timed_out = True
                _kill_group(proc, signal.SIGTERM)
                stop_at = now + INTERRUPT_GRACE_SECONDS
            if rc is not None:
                break
            if stop_at is not None and now >= stop_at:
                _kill_group(proc, signal.SIGKILL)
                _kill_ranks(started, host, outcome)
                proc.wait()
                break
            time.sleep(_POLL_SECONDS)
    finally:
        if tailer is not None:
            tailer.pump(final=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
    # Strays: ranks still alive after mpiexec itself ended (they run in sessions of their own).
    started, failed, _ = _markers(directory)
    for rank in sorted(failed):
        failures.setdefault(rank, failed[rank])
    _kill_ranks(started, host, outcome)
    outcome.returncode = proc.returncode if proc.returncode is not None else 1
    if failures:
        # Uncaught exceptions first: they are the cause; vanished ranks may be their consequence.
        ordered = sorted(failures.items(), key=lambda item: (item[0] not in failed, item[0]))
        outcome.failures = dict(ordered)
    return outcome


class _Tailer:
    """Copy each rank's output files to our stdout/stderr, one whole line at a time, tagged [rank]."""

    def __init__(self, np: int, directory: str) -> None:
        self.sources = [(rank, Path(directory) / f"rank.{rank}.{name}", stream)
                        for rank in range(np) for name, stream in (("stdout", sys.stdout),
                                                                   ("stderr", sys.stderr))]
        self.offsets = {path: 0 for _, path, _ in self.sources}
        self.partial = {path: b"" for _, path, _ in self.sources}

    def pump(self, final: bool = False) -> None:
        for rank, path, stream in self.sources:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            self.offsets[path] += len(data)
            data = self.partial[path] + data
            lines = data.split(b"\n")
            self.partial[path] = b"" if final else lines.pop()
            for line in lines:
                if line or final is False:
                    stream.write(f"[{rank}] {line.decode(errors='replace')}\n")
            stream.flush()


def _kill_ranks(started: Mapping[int, tuple[str, int]], host: str, outcome: JobOutcome) -> None:
    for _rank, (rank_host, pid) in sorted(started.items()):
        if rank_host == host and _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                outcome.killed.append(pid)
            except ProcessLookupError:
                pass


def exit_status(outcome: JobOutcome) -> int:
    """The launcher's exit status: 130 on interrupt, 124 on timeout, else non-zero if anything failed."""
    if outcome.interrupted:
        return 130
    if outcome.timed_out:
        return 124
    if outcome.returncode != 0:
        return outcome.returncode if 0 < outcome.returncode < 256 else 1
    return 1 if outcome.failures else 0


def report(outcome: JobOutcome) -> None:
    """Print the outcome's summary to stderr (the launcher's user-facing output)."""
    text = outcome.summary()
    if text:
        print(text, file=sys.stderr, flush=True)
