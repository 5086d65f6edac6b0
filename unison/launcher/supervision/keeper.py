"""The parent of each rank on unisonrun's host: record how the rank ended before mpiexec can react to it.

When a rank dies, mpiexec (Hydra's proxy) kills the other ranks at once. Which died first cannot be
read back afterwards: the kernel may even finish the second death before the first (the proxy reacts
to the first rank's closed pipes, a moment before that rank is reported dead). So mpiexec starts this
small program in place of each local rank; it runs the rank as its child, waits for it, and writes
``ended-R`` (the rank's pid and exit code, negative for a signal) into the launcher's directory
*before* it exits itself. mpiexec sees the exit only then, so the marker of the rank that died first
is always on disk before any other rank is stopped because of it.

The keeper holds the rank's inherited descriptors (output, PMI) open while it waits, ignores the
signals mpiexec forwards to the whole process group (the rank gets them too), and exits with the
rank's status (re-raising the same signal). The rank dies with its keeper (``PR_SET_PDEATHSIG``).

On another host than unisonrun's, where the launcher's directory does not exist, the keeper sends
the marker over the launcher's marker relay instead (`unison.launcher.supervision.relay`; `unison._contract`'s
``send_marker``, which the ranks use too): a line signed with the relay's key, answered once the marker is on disk.

Before the program starts, the keeper gives it the variables horovodrun gives its workers
(`horovod_variables`): ``HOROVOD_HOSTNAME``, ``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK`` and ``HOROVOD_CROSS_SIZE``,
read from mpiexec's variables and the launch's host list (``UNISON_LAUNCHER_HOSTS``, in rank order).

Run as ``python -I -S keeper.py PROGRAM [ARGS...]`` (this file, by its path): only the standard library and `unison._contract`
(loaded from its file, as it imports nothing else), so it starts in a few tens of milliseconds. Without a rank number, or with neither the launcher's directory nor a relay,
it simply becomes the program. `command` with ``remote=True`` starts it through ``sh`` so that a host
without this Python at this path runs the program bare instead of failing.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import sys

if __package__:  # imported as unison.launcher.supervision.keeper
    from ..._contract import (
        LAUNCHER_DIR_VARIABLE,
        LAUNCHER_HOSTS_VARIABLE,
        LAUNCHER_KEEP_GOING_VARIABLE,
        LAUNCHER_RELAY_VARIABLE,
        marker_name,
        parse_hosts,
        send_marker,
        write_atomically,
    )
else:  # run as ``python -I -S keeper.py``: no package, so the contract is loaded from its file
    import importlib.util

    _unison = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # unison/launcher/supervision/
    _spec = importlib.util.spec_from_file_location("unison_contract", os.path.join(_unison, "_contract.py"))
    assert _spec is not None and _spec.loader is not None
    _contract = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_contract)
    globals().update({name: getattr(_contract, name) for name in _contract.__all__})

# HOSTS_VARIABLE, KEEP_GOING_VARIABLE and RELAY_VARIABLE: the contract's names, under the keeper's shorter ones.
__all__ = ["HOSTS_VARIABLE", "KEEP_GOING_VARIABLE", "RELAY_VARIABLE", "command", "horovod_variables", "main",
           "placement"]

_PR_SET_PDEATHSIG = 1
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
HOSTS_VARIABLE = LAUNCHER_HOSTS_VARIABLE  # the launch's hosts, host:slots,... in rank order
RELAY_VARIABLE = LAUNCHER_RELAY_VARIABLE  # KEY@HOST:PORT of the launcher's marker relay
# "1": a rank killed by a signal is reported to mpiexec as exit status 128+N, not as that signal, since
# MPICH's mpiexec stops every other rank after a death by signal even with -disable-auto-cleanup
# (parameter-server trainers go on without the one lost).
KEEP_GOING_VARIABLE = LAUNCHER_KEEP_GOING_VARIABLE
# Runs the keeper where this Python and this file exist on the rank's host, else the program itself.
_REMOTE = ('p="$1"; k="$2"; shift 2; if [ -x "$p" ] && [ -f "$k" ]; then exec "$p" -I -S "$k" "$@"; fi; '
           'exec "$@"')
# mpiexec signals each rank's whole process group: the rank receives these itself.
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _first(environ: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def placement(hosts: str, size: int) -> list[str]:
    """The host of each of `size` ranks when ranks fill each host's slots in turn (mpiexec's default),
    starting over at the first host when every slot is taken.

    Example:
        >>> placement("a:2,b:1", 4)
        ['a', 'a', 'b', 'a']
    """
    try:
        pairs = parse_hosts(hosts)
    except ValueError:
        return []
    slots = [name for name, count in pairs for _ in range(count)]
    return [slots[rank % len(slots)] for rank in range(size)] if slots else []


def horovod_variables(environ: dict[str, str], hostname: str = "") -> dict[str, str]:
    """The variables horovodrun gives each worker, for the rank `environ` (mpiexec's variables) describes.

    With the launch's host list (``UNISON_LAUNCHER_HOSTS``; in an elastic job the epoch's elastic
    hosts) the host, local and cross ranks follow from it as in Horovod: the local rank counts the
    ranks before this one on its host, the cross rank counts the hosts before this one that also
    run that local rank. Without it: mpiexec's host name and local rank, cross rank 0 of 1. Nothing
    when mpiexec's rank and size are unknown.

    Example:
        >>> env = {"PMI_RANK": "2", "PMI_SIZE": "3", "UNISON_LAUNCHER_HOSTS": "a:2,b:2"}
        >>> horovod_variables(env)["HOROVOD_HOSTNAME"], horovod_variables(env)["HOROVOD_CROSS_RANK"]
        ('b', '1')
    """
    rank, size = _first(environ, _RANK_VARIABLES), _first(environ, _SIZE_VARIABLES)
    if rank is None or size is None or not 0 <= rank < size:
        return {}
    hosts = placement(environ.get(HOSTS_VARIABLE, ""), size)
    if hosts:
        host = hosts[rank]
        counts: dict[str, int] = {}  # ranks per host, in the order each host's first rank comes
        for name in hosts:
            counts[name] = counts.get(name, 0) + 1
        local_rank, local_size = hosts[:rank].count(host), counts[host]
        peers = [name for name, count in counts.items() if count > local_rank]  # hosts running that local rank
        cross_rank, cross_size = peers.index(host), len(peers)
    else:
        host = environ.get("PMI_HOSTNAME") or hostname or socket.gethostname()
        local = (_first(environ, _LOCAL_RANK_VARIABLES), _first(environ, _LOCAL_SIZE_VARIABLES))
        local_rank, local_size = (local[0], local[1]) if local[0] is not None and local[1] is not None else (rank, size)
        cross_rank, cross_size = 0, 1
    return {"HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(cross_rank), "HOROVOD_CROSS_SIZE": str(cross_size)}


def command(program: list[str], remote: bool = False) -> list[str]:
    """The command line that runs `program` under a keeper with this Python (`remote`: on any host)."""
    if remote:
        return ["/bin/sh", "-c", _REMOTE, "unison-keeper", sys.executable, os.path.abspath(__file__), *program]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *program]


def _record(directory: str, rank: str, pid: int, code: int) -> None:
    relay = os.environ.get(RELAY_VARIABLE, "")
    if not os.path.isdir(directory):
        if relay:
            send_marker(relay, marker_name("ended", rank), f"{pid} {code}\n")
        return
    try:
        write_atomically(os.path.join(directory, marker_name("ended", rank)), f"{pid} {code}\n")
    except OSError:
        pass  # the launcher and its directory are gone: nobody is left to tell


def _become_rank(program: list[str], keeper: int) -> None:
    """In the forked child: die with the keeper, restore default signals, then exec the program."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the rank outlives a killed keeper, as it would without one
    if os.getppid() != keeper:
        os._exit(1)  # the keeper died before prctl took effect
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; exec would keep that
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        sys.stderr.write(f"unisonrun: cannot run {program[0]!r}: {exc.strerror}\n")
        sys.stderr.flush()
    os._exit(127)  # the shell's status for a command it could not run


def main(program: list[str]) -> int:
    """Run `program` as this rank's child; record and return (or re-raise) how it ended."""
    rank = next((os.environ[v] for v in _RANK_VARIABLES if os.environ.get(v, "").isdigit()), "")
    directory = os.environ.get(LAUNCHER_DIR_VARIABLE, "")
    if not program:
        sys.stderr.write("usage: keeper.py PROGRAM [ARGS...]\n")
        return 2
    os.environ.update(horovod_variables(dict(os.environ)))
    reachable = bool(directory) and (os.path.isdir(directory) or bool(os.environ.get(RELAY_VARIABLE)))
    if not rank or not reachable:
        os.execvp(program[0], program)
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_rank(program, keeper)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _record(directory, rank, pid, code)
    if code < 0 and os.environ.get(KEEP_GOING_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return 128 - code
    if code < 0:
        # Exit the way the rank did, so mpiexec reports the same signal; no core file of our own.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(keeper, -code)
        return 128 - code  # a signal whose default is not to terminate
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
