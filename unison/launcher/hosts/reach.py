"""Run one short shell command on several hosts at once, the way mpiexec reaches them (launcher-exec, else ssh).

The elastic driver uses it after a failed launch, to learn which remote hosts cannot be reached at all
(``true`` fails there: the host vanished while the discovery script still lists it), and when the job
ends, to remove the shared-memory store on every remote host that ran ranks. mpiexec's launcher is
called as MPICH's Hydra and Open MPI call it, ``PROGRAM HOST COMMAND``; without ``--launcher-exec`` it
is ``ssh`` (never asking for a password). Every host gets the same time limit; nothing here raises for
a host that failed: each answer says what happened. `local_names` says which host names mean this
machine (the launcher, the elastic driver and the parameter servers' placement all ask it).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO

__all__ = ["LOOPBACK_NAMES", "HostAnswer", "Reach", "address_seen_from", "local_names", "reach_of", "run_on_hosts"]

_SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5")
_OUTPUT_CHARS = 300
# --mpi-args words that choose how mpiexec reaches other hosts (MPICH's Hydra, Open MPI).
_OWN_LAUNCHER = frozenset({"-launcher", "-bootstrap", "-launcher-exec", "-bootstrap-exec", "-rsh",
                           "plm_rsh_agent", "--launch-agent", "-launch-agent"})

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})


def local_names(hostname: str | None = None) -> frozenset[str]:
    """The names that mean this machine: loopback names, its host name, that name's first label and,
    for this machine's own name, its fully qualified name.

    Args:
        hostname: the host name to use instead of this machine's (tests, and callers that read it once).

    Example:
        >>> sorted(local_names("node7.cluster.example") - LOOPBACK_NAMES)
        ['node7', 'node7.cluster.example']
    """
    if hostname is None:
        return _this_machine()
    return LOOPBACK_NAMES | {name for name in (hostname, hostname.split(".")[0]) if name}


@functools.cache
def _this_machine() -> frozenset[str]:
    # getfqdn may ask DNS, which can take seconds where it is misconfigured: once per process
    return local_names(socket.gethostname()) | {name for name in (socket.getfqdn(),) if name}


@dataclasses.dataclass(frozen=True)
class Reach:
    """How mpiexec starts processes on another host: `launcher_exec`, else ssh; `usable` False when
    the job chose another bootstrap through --mpi-args (then the driver cannot follow it there)."""

    launcher_exec: str = ""
    usable: bool = True

    def command(self, host: str, remote: str) -> list[str]:
        """The local command line that runs the shell command `remote` on `host`."""
        if self.launcher_exec:
            return [self.launcher_exec, host, remote]
        return ["ssh", *_SSH_OPTIONS, host, remote]


@dataclasses.dataclass(frozen=True)
class HostAnswer:
    """What running the command on one host gave: its exit status (None: it ran past the time limit,
    or could not be started here), and the first few hundred characters of its output."""

    host: str
    returncode: int | None
    output: str
    started: bool = True  # False: the local launcher program itself could not be run

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self, command: str) -> str:
        """One line for the driver's log, e.g. ``launcher-exec h1 'true' exited with status 255: ...``."""
        if not self.started:
            return f"could not run {command}: {self.output}"
        what = (f"{command} ran past the time limit" if self.returncode is None
                else f"{command} exited with status {self.returncode}")
        return f"{what}: {self.output}" if self.output else what


def reach_of(launcher_exec: str, mpi_args: str) -> Reach:
    """The `Reach` of a job started with these unisonrun options."""
    words = [word.split("=", 1)[0] for word in shlex.split(mpi_args)]
    own = any(word in _OWN_LAUNCHER for word in words)
    return Reach(launcher_exec, usable=bool(launcher_exec) or not own)


def run_on_hosts(reach: Reach, hosts: Sequence[str], remote: str, env: Mapping[str, str] | None = None,
                 timeout_seconds: float = 10.0) -> list[HostAnswer]:
    """Run the shell command `remote` on every host in `hosts` at once; one answer per host, in order."""
    # Output goes to files, not pipes: a launcher that leaves a process behind holding its output
    # (an ssh master, a daemon it started) must not make its host look slow, or the driver wait.
    running: list[tuple[str, subprocess.Popen[str] | None, IO[str] | None, str]] = []
    for host in hosts:
        output_file: IO[str] = tempfile.TemporaryFile(mode="w+")
        try:
            proc = subprocess.Popen(reach.command(host, remote), env=None if env is None else dict(env),
                                    stdin=subprocess.DEVNULL, stdout=output_file,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
        except OSError as exc:
            output_file.close()
            running.append((host, None, None, str(exc)))
        else:
            running.append((host, proc, output_file, ""))
    deadline = time.monotonic() + timeout_seconds
    answers = []
    for host, started, kept, error in running:
        if started is None or kept is None:
            answers.append(HostAnswer(host, None, error, started=False))
            continue
        proc, output_file = started, kept
        try:
            returncode: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher and whatever it started
            except ProcessLookupError:
                pass
            proc.wait()
            returncode = None
        with output_file:
            output_file.seek(0)
            output = output_file.read(64 * _OUTPUT_CHARS)
        answers.append(HostAnswer(host, returncode, " ".join(output.split())[:_OUTPUT_CHARS]))
    return answers


def address_seen_from(hosts: Sequence[str]) -> str:
    """This host's address on its route to `hosts` (the first that resolves), for them to call back on.

    The kernel's choice of source address for a (never sent) UDP datagram to the host is the address
    that host can reach us at, whatever our host name resolves to (or fails to) there. Loopback
    answers are skipped; with none left, the host name as before.

    Example:
        >>> address_seen_from(["127.0.0.1"]) == socket.gethostname()
        True
    """
    for host in hosts:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, 9))  # a UDP connect sends nothing: it only picks the route
                address = str(probe.getsockname()[0])
        except OSError:
            continue
        if not address.startswith("127."):
            return address
    return socket.gethostname()
