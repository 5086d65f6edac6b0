"""Run one mpiexec job and make sure it ends: watch the ranks, name the one that failed, kill strays.

Every rank started under the launcher writes marker files into the job's directory (see
`unison._job.failure`): ``started-R`` (host and pid, at ``init()``), ``failed-R`` (the abort reason, from
the exception hook) and ``finished-R`` (at an orderly ``shutdown()``). The supervisor polls them with
mpiexec: a rank on this host whose process ended without ``finished-R`` died (signal, ``os._exit``); a
``failed-R`` means an uncaught exception. After either, the job gets `GRACE_SECONDS` to end by itself
(the abort normally ends it in under a second), then everything is killed. mpiexec starts each rank in
its own session, so killing mpiexec's process group is not enough: the registered pids are killed too.

Whom to name is decided by `blame` from plain data. When one rank dies, mpiexec kills the others
within milliseconds; `DeathWatch` gets the order of death from the kernel, so the rank that died first
(the cause) is named, not the lowest rank. Once the launcher itself stops the job (``--timeout``,
Ctrl-C, SIGTERM), the ranks it stops are not failures.

How the launcher stops a job: ``--timeout`` and Ctrl-C send mpiexec SIGINT, which it passes to every
rank (a ``KeyboardInterrupt``: ``finally:`` blocks run); SIGTERM is passed on as SIGTERM. Each later
Ctrl-C or SIGTERM is passed on too (MPICH's mpiexec asks for a second Ctrl-C to end the ranks at
once), and shortens what is left of the grace to `FORCE_GRACE_SECONDS`. Whatever is still alive
when the grace ends is killed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from ..._job.failure import GRACE_SECONDS as RANK_GRACE_SECONDS
from ..mpi.lines import RankTags
from ..mpi.messages import OutputRelay
from .blame import blame, could_not_start, finished_early, read_markers
from .deaths import DeathWatch, alive
from .records import keep_records, records_line
from .reports import report_lines
from .segments import Segments

__all__ = ["GRACE_SECONDS", "JobOutcome", "supervise"]

GRACE_SECONDS = RANK_GRACE_SECONDS + 2.0  # ranks hard-exit 5 s after an abort; kill at 7 s
INTERRUPT_GRACE_SECONDS = 3.0
FORCE_GRACE_SECONDS = 0.5  # after a second Ctrl-C (or SIGTERM): mpiexec's own forced stop, then ours
START_FAILED_EXIT = 2  # the job could not start: a rank's own set-up failed in init() (as a bad command line)
KEEPER_WAIT_SECONDS = 1.0  # a death seen before its keeper's ended-R marker waits this long for it
_POLL_SECONDS = 0.01


@dataclasses.dataclass
class JobOutcome:
    """How a supervised job ended."""

    returncode: int
    failures: dict[int, str]  # rank -> why (first failure first)
    interrupted: bool = False
    signal: int = 0  # the signal that interrupted the launcher (SIGINT, SIGTERM), when `interrupted`
    timed_out: bool = False
    timeout: float | None = None
    announced: bool = False  # the timeout line was printed when it fired
    killed: list[int] = dataclasses.field(default_factory=list)  # pids killed after the job
    told: set[int] = dataclasses.field(default_factory=set)  # failures already printed while the job ran
    ended: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> its own exit code, as its keeper saw it (-N: signal N; `own_ends`)
    mpi_messages: int = 0  # lines of MPICH's own stop report held back (unison explained the stop)
    records: Path | None = None  # where the ranks' flight records of a failure were kept
    early: str = ""  # with no failure to name: the ranks that finished while others waited (`finished_early`)

    def summary(self) -> str:
        """The launcher's closing lines: why it stopped the job, then each failed rank; '' on success.

        Failures are only those that happened before the launcher began stopping the job: ranks it
        stops itself (timeout, interrupt) are not failures.
        """
        lines = []
        if self.timed_out and not self.announced:
            lines.append(timeout_line(self.timeout, stopped=True))
        lines += report_lines({rank: why for rank, why in self.failures.items() if rank not in self.told})
        if self.early and not self.failures:
            lines.append(f"unisonrun: {self.early}")
        if self.records is not None:
            lines.append(records_line(self.records))
        if self.interrupted:
            lines.append(interrupt_line(self.signal))
        if not lines and self.returncode != 0 and not self.timed_out:
            lines.append(f"unisonrun: the job failed with exit status {self.returncode}; see the ranks' "
                         "output above.")
        return "\n".join(lines)


def timeout_line(timeout: float | None, stopped: bool) -> str:
    """The line that says the job ran past --timeout (it comes first: it is why the ranks stopped)."""
    limit = f"--timeout {timeout:g} s" if timeout is not None else "--timeout"
    return (f"unisonrun: the job ran past {limit}; "
            + ("stopped every rank (exit status 124)." if stopped else "stopping every rank (exit status 124)."))


def interrupt_line(signum: int) -> str:
    """The line that says the launcher was interrupted (Ctrl-C) or terminated (SIGTERM) and stopped the job.

    Example:
        >>> interrupt_line(signal.SIGTERM)
        'unisonrun: terminated (SIGTERM); stopped every rank (exit status 143).'
    """
    if signum == signal.SIGTERM:
        return f"unisonrun: terminated (SIGTERM); stopped every rank (exit status {128 + signum})."
    return "unisonrun: interrupted; stopped every rank (exit status 130)."


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(cmd: Sequence[str], directory: Path, env: Mapping[str, str], *,
              timeout: float | None = None, stdout: int | None = None,
              tails: tuple[int, str] | None = None, announce: bool = False,
              keepers: bool = False, grace_seconds: float | None = None, keep_going: bool = False, role: str = "",
              check: Callable[[], Mapping[int, str]] | None = None, mpi_messages: Path | None = None,
              show_mpi_messages: bool = False, tags: RankTags | None = None) -> JobOutcome:
    """Run `cmd` (an mpiexec command line) until it ends, ending it when a rank fails.

    SIGINT and SIGTERM received meanwhile are forwarded to mpiexec, each one; ranks still alive
    `INTERRUPT_GRACE_SECONDS` after the first (`FORCE_GRACE_SECONDS` after a later one) are killed.
    ``--timeout`` stops the job as Ctrl-C does: SIGINT to mpiexec, then the same grace. With
    `announce`, the timeout line is printed the moment the timeout fires, before mpiexec's own
    messages about the ranks it stops. `keepers` says the local ranks run under `keeper`, whose
    ``ended-R`` markers say exactly which rank ended first.
    After a failure the job gets `grace_seconds` (default `GRACE_SECONDS`) to end by itself before
    everything is killed; an elastic launch passes 0: its state is in the commits, and the next
    launch starts as soon as this one is gone. MPICH's shared-memory segments that the local ranks
    mapped and did not unlink (an abrupt stop) are removed once the job ended (`Segments`).

    With `keep_going` (parameter-server trainers, whose mpiexec does not stop the others) a failed
    rank is named at once but does not stop the job, which ends when mpiexec does; `role` names ranks
    that never call ``unison.init()``. `check`, called at every poll, returns failures found outside the
    ranks' markers (rank -> why), named like the others and before them.

    mpiexec's output is relayed through `OutputRelay`: MPICH's own report of a stop (its banner, Hydra's
    cleanup lines) is held back, and once the job ended it is printed only if unison has no failure,
    interrupt or timeout of its own to report, or with `show_mpi_messages`; otherwise it goes to the
    file `mpi_messages` when given (appended), and nowhere when not. `tags` are the markers `cmd` asks
    MPICH's mpiexec to put before each rank's pieces of output (`rank_tags`): the relay then writes each
    rank's lines whole.

    After a failure the ranks' flight records are moved out of `directory` (which goes with the job): into
    the directory of `mpi_messages` (``--output-filename``) when given, else a new one (`records`).
    """
    host = socket.gethostname()
    proc, relays = _start(cmd, env, stdout, tags)
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
    watch = DeathWatch()
    start = time.monotonic()
    failures: dict[int, str] = {}
    stop_at: float | None = None
    stopping = False  # the launcher is stopping the job itself: what ends now is no failure
    forwarded = 0  # signals passed on to mpiexec
    outcome = JobOutcome(0, failures, timeout=timeout)
    started: dict[int, tuple[str, int]] = {}
    watched: set[int] = set()
    pending: list[tuple[float, list[int]]] = []  # deaths waiting for their keepers' markers
    wait = KEEPER_WAIT_SECONDS if keepers else 0.0
    grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
    segments = Segments()

    def local_pids() -> list[int]:
        return [pid for rank_host, pid in started.values() if rank_host == host]

    def look(final: bool = False) -> None:
        # Deaths first, then markers: a marker written before a death is then seen with it.
        now = time.monotonic()
        pending.extend((now, group) for group in watch.deaths())
        markers = read_markers(directory)
        started.update(markers.started)
        outcome.ended.update(own_ends(markers.ended, outcome.killed))
        due = [group for seen, group in pending if final or now - seen >= wait]
        del pending[:len(due)]
        if not stopping:
            failures.update(blame(markers, due, failures, host, role=role, independent=keep_going))
        for rank, (rank_host, pid) in sorted(started.items()):
            if rank not in watched and rank_host == host:
                watched.add(rank)
                watch.watch(rank, pid)
        segments.sample(local_pids(), now)

    try:
        while True:
            rc = proc.poll()
            if tailer is not None:
                tailer.pump()
            if check is not None and not stopping:
                failures.update({rank: why for rank, why in check().items() if rank not in failures})
            look()
            if keep_going:  # the job goes on: say now who failed, once
                for rank in [r for r in failures if r not in outcome.told]:
                    outcome.told.add(rank)
                    print(f"unisonrun: {failures[rank]}", file=sys.stderr, flush=True)
            now = time.monotonic()
            if failures and stop_at is None and not keep_going:
                stop_at = now + grace
            while forwarded < len(interrupted):
                signum = interrupted[forwarded]
                if not outcome.interrupted and not outcome.timed_out:
                    outcome.interrupted, outcome.signal = True, signum
                allowed = INTERRUPT_GRACE_SECONDS if forwarded == 0 and not outcome.timed_out else FORCE_GRACE_SECONDS
                forwarded += 1
                stopping = True
                _send(proc, signum)  # a second Ctrl-C too: MPICH's mpiexec asks for it to end the ranks at once
                stop_at = min(stop_at or float("inf"), now + allowed)
            if timeout is not None and now - start > timeout and stop_at is None:
                outcome.timed_out = stopping = True
                if announce:
                    print(timeout_line(timeout, stopped=False), file=sys.stderr, flush=True)
                    outcome.announced = True
                for relay, _ in relays:  # Hydra's "Press Ctrl-C again" would be about a Ctrl-C nobody typed
                    relay.filter.hold_ctrl_c_notice = True
                _send(proc, signal.SIGINT)  # as Ctrl-C: every rank's finally: blocks run
                stop_at = now + INTERRUPT_GRACE_SECONDS
            if rc is not None:
                break
            if stop_at is not None and now >= stop_at:
                stopping = True
                segments.sample(local_pids(), now, force=True)
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
    # mpiexec has ended, and with it every rank it could reach: a last look names what the previous
    # poll missed. Then strays: ranks still alive (they run in sessions of their own).
    look(final=True)
    watch.close()
    segments.sample([pid for pid in local_pids() if alive(pid)], time.monotonic(), force=True)
    _kill_ranks(started, host, outcome)
    segments.remove()
    outcome.returncode = proc.returncode if proc.returncode is not None else 1
    if outcome.returncode != 0 and not failures and not stopping:
        outcome.early = finished_early(read_markers(directory), host) or ""
    _settle_messages(relays, outcome, mpi_messages, show_mpi_messages)
    if failures:  # the ranks' flight records (a stall, a deadlock, a rank lost), out of the directory
        outcome.records = keep_records(directory, mpi_messages.parent if mpi_messages is not None else None)
    return outcome


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


_RELAY_END_SECONDS = 2.0  # a stray that inherited mpiexec's output must not hold the launcher


def _start(cmd: Sequence[str], env: Mapping[str, str], stdout: int | None,
           tags: RankTags | None) -> tuple[subprocess.Popen[bytes], list[tuple[OutputRelay, Callable[[bytes], None]]]]:
    """Start mpiexec with its stdout (unless redirected) and stderr relayed through `OutputRelay`s."""
    pipes = {"stderr": os.pipe()}
    if stdout is None:
        pipes["stdout"] = os.pipe()
    try:
        proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True,
                                stdout=pipes["stdout"][1] if "stdout" in pipes else stdout,
                                stderr=pipes["stderr"][1])
    except BaseException:
        for read_fd, write_fd in pipes.values():
            os.close(read_fd)
            os.close(write_fd)
        raise
    relays = []
    for name, (read_fd, write_fd) in pipes.items():
        os.close(write_fd)
        write = _writer(name)
        relays.append((OutputRelay(read_fd, write, tags), write))
    return proc, relays


def _writer(name: str) -> Callable[[bytes], None]:
    """Write bytes to sys.stdout or sys.stderr as they are when called (a test may replace them)."""
    def write(data: bytes) -> None:
        stream = getattr(sys, name)
        buffer = getattr(stream, "buffer", None)
        stream.flush()
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode(errors="replace"))
            stream.flush()
    return write


def _settle_messages(relays: Sequence[tuple[OutputRelay, Callable[[bytes], None]]], outcome: JobOutcome,
                     path: Path | None, show: bool) -> None:
    """Print MPICH's held-back stop report, or keep it out of the way when unison explained the stop."""
    explained = bool(outcome.failures) or outcome.interrupted or outcome.timed_out
    for relay, write in relays:
        held = relay.join(_RELAY_END_SECONDS)
        if not held:
            continue
        if show or not explained:
            write(b"".join(held))
            continue
        outcome.mpi_messages += len(held)
        if path is not None:
            try:
                with open(path, "ab") as f:
                    f.write(b"".join(held))
            except OSError:
                pass


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
        if rank_host == host and alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                outcome.killed.append(pid)
            except ProcessLookupError:
                pass


def own_ends(ended: Mapping[int, tuple[int, int]], killed: Collection[int]) -> dict[int, int]:
    """The exit codes the keepers saw (rank -> (pid, code)), less those of ranks the launcher killed.

    A rank killed by the launcher (after a failure's grace, at once in an elastic launch) ended as the
    launcher made it, not as it would have: a rank whose uncaught exception was named and that was
    killed before it finished exiting must not report SIGKILL's 137 in place of its own 1.

    Example:
        >>> own_ends({0: (10, -9), 1: (11, 3)}, killed=[10])
        {1: 3}
    """
    return {rank: code for rank, (pid, code) in ended.items() if pid not in killed}


def exit_status(outcome: JobOutcome) -> int:
    """The launcher's exit status: 130 on Ctrl-C, 143 on SIGTERM, 124 on timeout; after a failure, the status of the
    first failed rank as a shell reports it (docs/launcher.md, "Exit status").

    The first failure decides, not mpiexec's status: MPICH's mpiexec combines the statuses of every
    rank with a bitwise or, those it killed itself included, so one failure could end as 9, 11 or 14.
    A rank that raised, or that unison stopped, exits 1; a rank that ended without shutting unison down
    (``os._exit(0)``) counts as 1; a rank killed by signal N as 128 + N (137 for SIGKILL). A rank whose own
    set-up failed in ``init()`` (a setting it cannot parse) means the job could not start: 2, whatever its status.

    Example:
        >>> exit_status(JobOutcome(11, {1: "rank 1 failed"}, ended={0: -9, 1: 1, 2: 1}))
        1
        >>> exit_status(JobOutcome(9, {2: "rank 2 killed"}, ended={2: -9, 0: -9}))
        137
        >>> exit_status(JobOutcome(1, {1: "rank 1 (h, pid 11) could not start: ConfigError: bad"}, ended={0: 1, 1: 1}))
        2
    """
    if outcome.interrupted:
        return 128 + (outcome.signal or signal.SIGINT)
    if outcome.timed_out:
        return 124
    if outcome.failures and could_not_start(next(iter(outcome.failures.values()))):
        return START_FAILED_EXIT
    if outcome.failures:
        code = outcome.ended.get(next(iter(outcome.failures)))
        if code is None:  # a rank on another host, or no keeper: mpiexec's word is all there is
            return outcome.returncode if 0 < outcome.returncode < 256 else 1
        return 128 - code if code < 0 else code if 0 < code < 256 else 1
    if outcome.returncode != 0:
        return outcome.returncode if 0 < outcome.returncode < 256 else 1
    return 0


def report(outcome: JobOutcome) -> None:
    """Print the outcome's summary to stderr (the launcher's user-facing output)."""
    text = outcome.summary()
    if text:
        print(text, file=sys.stderr, flush=True)
