"""`unisonrun --pservers N`: start N parameter servers running the job's own script, for its trainers.

Where they run: without ``-H``/``--hostfile`` every server runs on this host and listens on loopback.
With hosts, server ``i`` runs on the ``i % H``-th distinct host in the order given (round robin, so
``-H a:2,b:2 --pservers 3`` puts servers 0 and 2 on ``a`` and server 1 on ``b``). Then every server
listens on all interfaces, and the trainers reach it as ``HOST:PORT`` with the host's name as given
(the name mpiexec reaches it by). A server on another host is started the way mpiexec starts ranks
there, ``LAUNCHER HOST COMMAND`` (``--launcher-exec``, else ssh; `_host_exec.Reach`); the command
reads the job secret from its standard input (never the command line), runs the script, prints the
address once the server listens, and stops the server when its standard input closes (``unisonrun``
exited or was killed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..errors import LaunchError
from ._host_exec import Reach, local_names

__all__ = ["Placement", "hosts_of", "parameter_servers", "place_servers"]

_START_SECONDS = 60.0
_EXIT_SECONDS = 30.0
# Forwarded to a server on another host (its environment is the remote login's, not this one's);
# the job secret travels on its standard input instead.
_FORWARDED_PREFIXES = ("UNISON_", "PYTHONPATH")
_SECRET_VARIABLES = frozenset({"UNISON_SECRET", "UNISON_SECRET_FILE"})

# Runs on the server's host under sh. Its standard output carries only the address line; the
# script's own output goes to standard error.
_REMOTE = """cd {cwd} || exit 97
IFS= read -r UNISON_SECRET || exit 98
export UNISON_SECRET
d=$(mktemp -d "${{TMPDIR:-/tmp}}/unisonrun-ps-XXXXXX") || exit 99
exec 3<&0
env {variables} UNISON_PS_ADDRESS_FILE="$d/address" {program} </dev/null 1>&2 &
pid=$!
(cat <&3 >/dev/null 2>&1; kill $pid 2>/dev/null) >/dev/null 2>&1 &
exec 3<&-
while [ ! -s "$d/address" ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
if [ -s "$d/address" ]; then cat "$d/address"; echo; fi
wait $pid
rc=$?
rm -rf "$d"
exit $rc"""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one server runs: `host` as the trainers reach it, and whether that is this host."""

    index: int
    host: str
    local: bool


def hosts_of(hosts: str, hostfile_text: str = "") -> list[str]:
    """The distinct host names of ``-H host:slots,...`` or of a hostfile's lines, in order.

    Example:
        >>> hosts_of("a:2,b:2,a:1")
        ['a', 'b']
        >>> hosts_of("", "node1 slots=4\\n# comment\\nnode2:2\\n")
        ['node1', 'node2']
    """
    names = [entry.split(":", 1)[0].strip() for entry in hosts.split(",")] if hosts else []
    for line in hostfile_text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            names.append(words[0].split(":", 1)[0])
    return list(dict.fromkeys(name for name in names if name))


def place_servers(count: int, hosts: Sequence[str], this_host: str) -> list[Placement]:
    """Deal `count` servers round robin over `hosts` (none: all on this host, on loopback).

    Example:
        >>> [(p.host, p.local) for p in place_servers(3, ["h0", "h1"], "h0")]
        [('h0', True), ('h1', False), ('h0', True)]
        >>> place_servers(1, [], "h0")
        [Placement(index=0, host='127.0.0.1', local=True)]
    """
    if count < 1:
        raise LaunchError(f"--pservers must be at least 1. Got --pservers {count}.")
    if not hosts:
        return [Placement(i, "127.0.0.1", True) for i in range(count)]
    here = local_names(this_host)
    return [Placement(i, host, host in here) for i, host in ((i, hosts[i % len(hosts)]) for i in range(count))]


def _spans_hosts(placements: Sequence[Placement], hosts: Sequence[str], this_host: str) -> bool:
    """Whether trainers may run elsewhere than here (then servers listen on every interface)."""
    here = local_names(this_host)
    return any(not p.local for p in placements) or any(h not in here for h in hosts)


class _Server:
    """One started server process (here, or the launcher's process reaching its host)."""

    def __init__(self, placement: Placement, proc: subprocess.Popen[bytes], address_file: Path | None) -> None:
        self.placement, self.proc, self.address_file = placement, proc, address_file
        self._line = b""

    def address(self) -> str:
        """The ``host:port`` it listens on once known, else ""."""
        if self.address_file is not None:
            return self.address_file.read_text().strip() if self.address_file.exists() else ""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._line and select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self._line += chunk
        return self._line.split(b"\n", 1)[0].decode().strip() if b"\n" in self._line else ""

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


@contextlib.contextmanager
def parameter_servers(count: int, num_trainers: int, program: Sequence[str], mode: str = "", *,
                      hosts: str = "", hostfile: str = "", launcher_exec: str = "") -> Iterator[dict[str, str]]:
    """Run `count` servers (the same `program`, whose ``unison.ps.init()`` serves), and yield the trainers' variables.

    Each server listens on a free port and reports its address; the trainers get every address, the
    number of trainers and the job secret (made here unless ``UNISON_SECRET`` is set). With `hosts`
    or `hostfile`, servers are placed round robin on the hosts (see the module's docstring). On
    leaving, the servers get time to exit by themselves (they do once every trainer finished), then
    are stopped.
    """
    if not program:
        raise LaunchError("No program given: unisonrun -np N --pservers M python train.py")
    from ..service.security import new_secret

    hostfile_text = ""
    if hostfile:
        try:
            hostfile_text = Path(hostfile).read_text()
        except OSError as exc:
            raise LaunchError(f"--hostfile {hostfile!r} could not be read: {exc}") from None
    this_host = socket.gethostname()
    names = hosts_of(hosts, hostfile_text)
    placements = place_servers(count, names, this_host)
    wide = _spans_hosts(placements, names, this_host)
    secret = os.environ.get("UNISON_SECRET") or new_secret()
    common = {"UNISON_PS_NUM_TRAINERS": str(num_trainers), "UNISON_PS_NUM_SERVERS": str(count),
              **({"UNISON_PS_MODE": mode} if mode else {})}
    # a server given "HOST:0" as its endpoint listens on every interface, on a free port
    listen = {"UNISON_PS_ENDPOINTS": ",".join(f"{p.host}:0" for p in placements)} if wide else {}
    reach = Reach(launcher_exec)
    servers: list[_Server] = []
    with tempfile.TemporaryDirectory(prefix="unisonrun-ps-") as directory:
        try:
            for p in placements:
                role = {**common, **listen, "UNISON_PS_ROLE": "server", "UNISON_PS_SERVER_INDEX": str(p.index)}
                if p.local:
                    file = Path(directory) / f"server-{p.index}.address"
                    env = dict(os.environ, **role, UNISON_SECRET=secret, UNISON_PS_ADDRESS_FILE=str(file))
                    servers.append(_Server(p, subprocess.Popen(list(program), env=env), file))
                    continue
                forwarded = {k: v for k, v in os.environ.items()
                             if k.startswith(_FORWARDED_PREFIXES) and k not in _SECRET_VARIABLES}
                command = reach.command(p.host, _remote_command(program, {**forwarded, **role}))
                try:
                    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            start_new_session=True)
                except OSError as exc:
                    raise LaunchError(f"parameter server {p.index} could not be started on {p.host} with "
                                      f"{command[0]}: {exc}") from None
                servers.append(_Server(p, proc, None))
                assert proc.stdin is not None
                proc.stdin.write(secret.encode() + b"\n")
                proc.stdin.flush()
            deadline = time.monotonic() + _START_SECONDS
            while not all(s.address() for s in servers):
                for s in servers:
                    if s.proc.poll() is not None and not s.address():
                        raise LaunchError(f"parameter server {s.placement.index} on {s.placement.host} (pid "
                                          f"{s.proc.pid}) exited with status {s.proc.returncode} before it "
                                          "listened; its output above says why.")
                if time.monotonic() > deadline:
                    late = [f"{s.placement.index} on {s.placement.host}" for s in servers if not s.address()]
                    raise LaunchError(f"parameter servers {', '.join(late)} did not listen within "
                                      f"{_START_SECONDS:.0f} s.")
                time.sleep(0.05)
            endpoints = ",".join(s.endpoint(wide) for s in servers)
            yield {**common, "UNISON_SECRET": secret, "UNISON_PS_ROLE": "trainer", "UNISON_PS_ENDPOINTS": endpoints}
        finally:
            _stop(servers)


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
