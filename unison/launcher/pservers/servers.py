"""`unisonrun --pservers N`: start N parameter servers running the job's own script, for its trainers.

Where they run: without ``-H``/``--hostfile`` every server runs on this host and listens on loopback.
With hosts, server ``i`` runs on the ``i % H``-th distinct host in the order given (round robin, so
``-H a:2,b:2 --pservers 3`` puts servers 0 and 2 on ``a`` and server 1 on ``b``). Then every server
listens on all interfaces, and the trainers reach it as ``HOST:PORT`` with the host's name as given
(the name mpiexec reaches it by). A server on another host is started the way mpiexec starts ranks
there, ``LAUNCHER HOST COMMAND`` (``--launcher-exec``, else ssh; `hosts.reach.Reach`); the command
reads the job secret from its standard input (never the command line), runs the script, prints the
address once the server listens, and stops the server when its standard input closes (``unisonrun``
exited or was killed).

While the trainers run, `ServerSet.check` (called by the launcher's supervisor at every poll)
watches the servers. A server that ends by its own rule (status 0: every trainer finished; 3: the
rest were lost, ``unison.ps.server.LOST_EXIT_STATUS``) leaves a record of the trainers it counted
lost; once every server has ended, a lost trainer still running (stopped, or hung) is killed and
named, so the job ends. A server that dies otherwise is named at once and, when the job keeps
checkpoints (``UNISON_PS_CHECKPOINT_DIR``), started again on the same address, resuming from its
last checkpoint, up to `RESTARTS` times; without checkpoints its shard is lost and the trainers
that use it stop with ``ServerUnavailableError`` within ``UNISON_PS_RECONNECT_SECONDS``. What to do
is decided by `decisions.server_exit` from plain data, where each server runs by `decisions.place_servers`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...config import load_settings
from ...errors import ConfigError, LaunchError
from ..hosts.reach import Reach, local_names
from ..mpi.variables import nameable
from ..supervision.blame import how_ended
from ..supervision.deaths import alive
from .decisions import RESTARTS, Placement, hosts_of, place_servers, server_exit, spans_hosts

__all__ = ["ServerSet", "parameter_servers"]

_START_SECONDS = 60.0
_EXIT_SECONDS = 30.0
_CHECK_SECONDS = 0.1
# Forwarded to a server on another host (its environment is the remote login's, not this one's);
# the job secret and unisonrun's -x pairs travel on its standard input instead (no value on a command line).
_FORWARDED_PREFIXES = ("UNISON_", "PYTHONPATH")
_SECRET_VARIABLES = frozenset({"UNISON_SECRET", "UNISON_SECRET_FILE"})

# Runs on the server's host under sh. Its standard output carries only the address line; the
# script's own output goes to standard error. The -x pairs it reads are given to the program alone
# (env's arguments), never to the script's own shell.
_REMOTE = """cd {cwd} || exit 97
IFS= read -r UNISON_SECRET || exit 98
export UNISON_SECRET
set --
while IFS= read -r pair && [ -n "$pair" ]; do set -- "$@" "$pair"; done
d=$(mktemp -d "${{TMPDIR:-/tmp}}/unisonrun-ps-XXXXXX") || exit 99
exec 3<&0
env "$@" {variables} UNISON_PS_ADDRESS_FILE="$d/address" {program} </dev/null 1>&2 &
pid=$!
(cat <&3 >/dev/null 2>&1; kill $pid 2>/dev/null) >/dev/null 2>&1 &
exec 3<&-
while [ ! -s "$d/address" ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
if [ -s "$d/address" ]; then cat "$d/address"; echo; fi
wait $pid
rc=$?
if [ -s "$d/address.end" ]; then cat "$d/address.end"; echo; fi
rm -rf "$d"
exit $rc"""


class _Server:
    """One started server process (here, or the launcher's process reaching its host)."""

    def __init__(self, placement: Placement, proc: subprocess.Popen[bytes], address_file: Path | None) -> None:
        self.placement, self.proc, self.address_file = placement, proc, address_file
        self._line = b""
        self.restarts = 0
        self.settled = ""  # "ended" or "lost" once the launcher is done with it
        self.known_address = ""

    def _read_output(self, until_end: bool = False) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while until_end or select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self._line += chunk
            if not until_end and b"\n" in self._line:
                break

    def address(self) -> str:
        """The ``host:port`` it listens on once known, else ""."""
        if self.address_file is not None:
            return self.address_file.read_text().strip() if self.address_file.exists() else ""
        if b"\n" not in self._line:
            self._read_output()
        return self._line.split(b"\n", 1)[0].decode().strip() if b"\n" in self._line else ""

    def end_record(self) -> dict[str, Any]:
        """What the ended server wrote about its end (`ParameterServer.end_record`); {} when nothing."""
        if self.address_file is not None:
            end = Path(str(self.address_file) + ".end")
            text = end.read_text() if end.exists() else ""
        else:
            self._read_output(until_end=True)
            text = self._line.decode(errors="replace").split("\n", 1)[1] if b"\n" in self._line else ""
        try:
            record = json.loads(text.strip() or "{}")
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def describe(self) -> str:
        where = self.known_address or self.placement.host
        if self.address_file is None:  # the process here only reaches the server's host
            return f"parameter server {self.placement.index} ({where})"
        return f"parameter server {self.placement.index} ({where}, pid {self.proc.pid})"

    def endpoint(self, wide: bool) -> str:
        port = self.address().rpartition(":")[2]
        return f"{self.placement.host}:{port}" if wide else self.address()

    def close_input(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def _remote_command(program: Sequence[str], variables: Mapping[str, str]) -> str:
    return _REMOTE.format(cwd=shlex.quote(os.getcwd()), program=shlex.join(program),
                          variables=" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(variables.items())))


class ServerSet:
    """The job's servers while its trainers run: their variables for the trainers, and `check` for the supervisor."""

    def __init__(self, program: Sequence[str], secret: str, role_variables: Mapping[str, str], reach: Reach,
                 wide: bool, checkpoint_dir: str, reconnect_seconds: float,
                 pairs: Mapping[str, str] | None = None) -> None:
        self.program, self.secret, self.role_variables = list(program), secret, dict(role_variables)
        self.pairs = dict(pairs or {})  # unisonrun's -x pairs: every server gets them, as the trainers do
        self.reach, self.wide = reach, wide
        self.checkpoint_dir, self.reconnect_seconds = checkpoint_dir, reconnect_seconds
        self.servers: list[_Server] = []
        self.env: dict[str, str] = {}
        self.endpoints = ""
        self._next_check = 0.0
        self._strays_checked = False

    def __repr__(self) -> str:
        return f"<ServerSet servers={len(self.servers)} endpoints={self.endpoints!r}>"

    def start(self, placement: Placement, directory: str, endpoints: str = "") -> _Server:
        """Start server `placement.index` (`endpoints`: every server's, to listen on its own port again)."""
        role = {**self.role_variables, "UNISON_PS_ROLE": "server", "UNISON_PS_SERVER_INDEX": str(placement.index),
                **({"UNISON_PS_ENDPOINTS": endpoints} if endpoints else {})}
        if placement.local:
            file = Path(directory) / f"server-{placement.index}.address"
            for stale in (file, Path(f"{file}.end")):
                stale.unlink(missing_ok=True)
            env = {**os.environ, **self.pairs, **role, "UNISON_SECRET": self.secret,
                   "UNISON_PS_ADDRESS_FILE": str(file)}
            return _Server(placement, subprocess.Popen(self.program, env=env), file)
        forwarded = {k: v for k, v in os.environ.items()
                     if k.startswith(_FORWARDED_PREFIXES) and k not in _SECRET_VARIABLES and k not in self.pairs}
        command = self.reach.command(placement.host, _remote_command(self.program, {**forwarded, **role}))
        pairs = [f"{k}={v}" for k, v in self.pairs.items() if k not in role and k not in _SECRET_VARIABLES]
        try:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"parameter server {placement.index} could not be started on {placement.host} with "
                              f"{command[0]}: {exc}") from None
        assert proc.stdin is not None
        try:
            proc.stdin.write("".join(f"{line}\n" for line in [self.secret, *pairs, ""]).encode("utf-8", "surrogateescape"))
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # its launcher ended at once: the start's wait for the address names the server and its status
        return _Server(placement, proc, None)

    def check(self) -> dict[int, str]:
        """Watch the servers (see the module's docstring); return trainers killed as lost (trainer -> why)."""
        now = time.monotonic()
        if now < self._next_check or not self.servers:
            return {}
        self._next_check = now + _CHECK_SECONDS
        for i, server in enumerate(self.servers):
            code = server.proc.poll()
            if code is None or server.settled:
                continue
            action = server_exit(code, restarts=server.restarts, checkpoint_dir=self.checkpoint_dir)
            if action == "ended":
                server.settled = "ended"
                continue
            what = f"unisonrun: {server.describe()} {how_ended(code)}"
            if action == "restart":
                restarts = server.restarts + 1
                _say(f"{what}; starting it again on {server.known_address}, from its last checkpoint in "
                     f"{self.checkpoint_dir} (restart {restarts} of {RESTARTS}); the trainers wait for it up to "
                     f"UNISON_PS_RECONNECT_SECONDS ({self.reconnect_seconds:g} s).")
                directory = str(server.address_file.parent) if server.address_file is not None else ""
                again = self.start(server.placement, directory, self.endpoints)
                again.restarts, again.known_address = restarts, server.known_address
                self.servers[i] = again
                continue
            server.settled = "lost"
            why = (f"it was restarted {RESTARTS} times already" if server.restarts >= RESTARTS else
                   "the job keeps no checkpoints (UNISON_PS_CHECKPOINT_DIR) to resume it from")
            _say(f"{what}; it is not started again ({why}): its shard is lost, and each trainer that calls it "
                 f"stops with ServerUnavailableError within UNISON_PS_RECONNECT_SECONDS ({self.reconnect_seconds:g} "
                 "s).")
        if self._strays_checked or not all(server.settled for server in self.servers):
            return {}
        self._strays_checked = True
        return self._stop_lost_trainers()

    def _stop_lost_trainers(self) -> dict[int, str]:
        """Every server has ended: kill each trainer they counted lost that still runs, so the job ends."""
        lost: dict[int, tuple[str, int, str]] = {}
        for server in self.servers:
            if server.settled != "ended":
                continue
            for trainer, seen in server.end_record().get("lost", {}).items():
                if str(trainer).isdigit() and int(seen.get("pid") or 0):
                    lost.setdefault(int(trainer), (str(seen.get("host", "")), int(seen["pid"]), str(seen.get("why"))))
        named = {}
        here = local_names()
        for trainer, (host, pid, why) in sorted(lost.items()):
            if host in here:
                if not alive(pid):
                    continue  # it ended: the supervisor names it from its marker
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            else:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(self.reach.command(host, f"kill -KILL {pid} 2>/dev/null"), timeout=10,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            named[trainer] = (f"parameter-server trainer {trainer} ({host}, pid {pid}) was still running after every "
                              f"parameter server had ended without it; they counted it lost ({why}), so unisonrun "
                              "killed it.")
        return named


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def parameter_servers(count: int, num_trainers: int, program: Sequence[str], mode: str = "", *,
                      hosts: str = "", hostfile: str = "", launcher_exec: str = "",
                      env_pairs: Sequence[tuple[str, str]] = ()) -> Iterator[ServerSet]:
    """Run `count` servers (the same `program`, whose ``unison.ps.init()`` serves), and yield them as a `ServerSet`.

    Each server listens on a free port and reports its address; the trainers get (`ServerSet.env`)
    every address, the number of trainers and the job secret (made here unless ``UNISON_SECRET`` is
    set). With `hosts` or `hostfile`, servers are placed round robin on the hosts (see the module's
    docstring). `env_pairs` (unisonrun's ``-x``) reach every server as they reach the trainers; a server
    on another host reads them from its standard input, so a value may not hold a line break. On leaving, the servers get time to exit by themselves (they do once their trainers
    are done), then are stopped.
    """
    if not program:
        raise LaunchError("No program given: unisonrun -np N --pservers M python train.py")
    from ...rpc.security import new_secret

    given = {**os.environ, **dict(env_pairs)}  # a setting passed with -x counts here as it does on the servers
    try:
        settings = load_settings(given)
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    hostfile_text = ""
    if hostfile:
        try:
            hostfile_text = Path(hostfile).read_text()
        except OSError as exc:
            raise LaunchError(f"--hostfile {hostfile!r} could not be read: {exc}") from None
    this_host = socket.gethostname()
    names = hosts_of(hosts, hostfile_text)
    placements = place_servers(count, names, this_host)
    wide = spans_hosts(placements, names, this_host)
    if any(not p.local for p in placements):
        _check_remote_pairs(env_pairs)
    secret = given.get("UNISON_SECRET") or new_secret()
    common = {"UNISON_PS_NUM_TRAINERS": str(num_trainers), "UNISON_PS_NUM_SERVERS": str(count),
              **({"UNISON_PS_MODE": mode} if mode else {})}
    # a server given "HOST:0" as its endpoint listens on every interface, on a free port
    listen = {"UNISON_PS_ENDPOINTS": ",".join(f"{p.host}:0" for p in placements)} if wide else {}
    job = ServerSet(program, secret, {**common, **listen}, Reach(launcher_exec), wide, settings.ps_checkpoint_dir,
                    settings.ps_reconnect_seconds, dict(env_pairs))
    with tempfile.TemporaryDirectory(prefix="unisonrun-ps-") as directory:
        try:
            for p in placements:
                job.servers.append(job.start(p, directory))
            deadline = time.monotonic() + _START_SECONDS
            while not all(s.address() for s in job.servers):
                for s in job.servers:
                    if s.proc.poll() is not None and not s.address():
                        raise LaunchError(f"parameter server {s.placement.index} on {s.placement.host} (pid "
                                          f"{s.proc.pid}) exited with status {s.proc.returncode} before it "
                                          "listened; its output above says why.")
                if time.monotonic() > deadline:
                    late = [f"{s.placement.index} on {s.placement.host}" for s in job.servers if not s.address()]
                    raise LaunchError(f"parameter servers {', '.join(late)} did not listen within "
                                      f"{_START_SECONDS:.0f} s.")
                time.sleep(0.05)
            for s in job.servers:
                s.known_address = s.endpoint(wide)
            job.endpoints = ",".join(s.known_address for s in job.servers)
            job.env = {**common, "UNISON_SECRET": secret, "UNISON_PS_ROLE": "trainer",
                       "UNISON_PS_ENDPOINTS": job.endpoints}
            yield job
        finally:
            _stop(job.servers)


def _check_remote_pairs(pairs: Sequence[tuple[str, str]]) -> None:
    r"""Refuse -x pairs that cannot reach a server on another host, which reads them line by line and
    hands them to ``env`` (a name starting with ``-`` would read as one of env's options).

    Example:
        >>> _check_remote_pairs([("A", "1"), ("B_2", "x = 'y' $HOME")])
        >>> _check_remote_pairs([("A", "two\nlines")])
        Traceback (most recent call last):
        ...
        unison.errors.LaunchError: -x A: a value with a line break cannot reach a parameter server on another host (it reads the -x pairs line by line); export it there instead.
    """
    for name, value in pairs:
        if not nameable(name):  # env would read a name starting with - as one of its options
            raise LaunchError(f"-x {name!r}: not a variable name that can reach a parameter server on another host.")
        if "\n" in value or "\r" in value:
            raise LaunchError(f"-x {name}: a value with a line break cannot reach a parameter server on another "
                              "host (it reads the -x pairs line by line); export it there instead.")


def _stop(servers: Sequence[_Server]) -> None:
    """Give the servers time to exit by themselves, then stop them (a remote one: by closing its input)."""
    deadline = time.monotonic() + _EXIT_SECONDS
    for s in servers:
        try:
            s.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            if s.address_file is None:
                s.close_input()
            else:
                s.proc.terminate()
    for s in servers:
        s.close_input()
        try:
            s.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
