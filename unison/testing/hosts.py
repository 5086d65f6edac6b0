"""Emulated hosts for multi-host tests: network namespaces with their own address, hostname and capped link.

Each emulated host is a network namespace holding one interface, ``eth0``, with the address
``10.77.0.<i+1>/24``; the other end of its veth pair sits in a private "switch" namespace whose bridge
joins all hosts, so nothing is added to the machine's own network namespace. An optional ``tbf``
qdisc on both ends of every link caps its bandwidth. A host's hostname exists only for the processes
started in it (``unshare --uts``); ``ip netns exec`` bind-mounts ``/etc/netns/<namespace>/hosts`` over
``/etc/hosts`` there, so every host resolves every other host's name.

A job spans the hosts through MPI's own multi-host launcher: ``mpiexec`` runs in the first host with
``-launcher ssh -launcher-exec SCRIPT``, where SCRIPT starts Hydra's proxy inside the named host's
namespace instead of over ssh. MPICH's default netmod (UCX) would move data through shared memory
between namespaces of one kernel; ``unisonrun --iface eth0`` selects the TCP netmod on that interface.

Everything created is named ``unison-<pid>-<random>-...`` and removed by `EmulatedHosts.close` (also at
exit and by ``python -m unison.testing.hosts cleanup``). Needs root and iproute2 (`ip`, `tc`,
`unshare`).

Example:
    >>> with EmulatedHosts(hosts=2, slots=2, rate_mbit=1000) as cluster:   # doctest: +SKIP
    ...     done = cluster.run(["python", "train.py"])
    ...     print(done.returncode, done.stdout)
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..ops import TextEnum

__all__ = ["EmulatedHosts", "HostsState", "cleanup", "unavailable_reason"]

log = logging.getLogger(__name__)

PREFIX = "unison-"
SUBNET = "10.77.0"
IFACE = "eth0"
NETNS_ETC = Path("/etc/netns")
# MPICH: send data over TCP sockets on the emulated links (UCX would use shared memory between
# namespaces of one kernel).
MPI_TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}

_live: dict[str, EmulatedHosts] = {}


def _nsswitch() -> str:
    """This machine's nsswitch.conf with host names looked up in /etc/hosts only."""
    try:
        lines = Path("/etc/nsswitch.conf").read_text().splitlines()
    except OSError:
        lines = []
    kept = [line for line in lines if not line.lstrip().startswith("hosts:")]
    return "\n".join([*kept, "hosts: files"]) + "\n"


_LAUNCHER_EXEC = """#!/bin/sh
# Hydra's ssh launcher calls: SCRIPT [ssh options] HOST COMMAND...; start COMMAND in HOST's namespace.
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "unison launcher-exec: unknown emulated host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host; $*"
"""


def unavailable_reason() -> str:
    """Why emulated hosts cannot be created here, or "" when they can."""
    if sys.platform != "linux":
        return "emulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns add)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need `{tool}` (apt-get install -y iproute2 util-linux)"
    return ""


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{shlex.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done


class HostsState(TextEnum):
    """Where a set of emulated hosts is in its life: made, being set up, up, or torn down."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


class EmulatedHosts:
    """K emulated hosts with S slots each, joined by a bridge; a context manager that always tears down.

    Args:
        hosts: number of hosts.
        slots: slots per host: one number for every host, or one per host (heterogeneous layouts).
        rate_mbit: cap every link at this many Mbit/s in each direction (tbf); None for no cap.
    """

    def __init__(self, hosts: int = 2, slots: int | Sequence[int] = 1, rate_mbit: float | None = None) -> None:
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1. Got hosts={hosts}.")
        self.slots = [int(slots)] * hosts if isinstance(slots, int) else [int(s) for s in slots]
        if len(self.slots) != hosts or min(self.slots) < 1:
            raise ValueError(f"slots needs {hosts} positive counts. Got slots={slots!r}.")
        self.rate_mbit = rate_mbit
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.hostnames = [f"h{i}" for i in range(hosts)]
        self.namespaces = [f"{self.tag}-h{i}" for i in range(hosts)]
        self.switch = f"{self.tag}-sw"
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self.state = HostsState.NEW
        self._dir: Path | None = None
        self._stats = {"runs": 0, "failed_runs": 0}

    def __repr__(self) -> str:
        return f"<EmulatedHosts {self.tag} {self.state} slots={self.slots} rate_mbit={self.rate_mbit}>"

    def statistics(self) -> dict[str, int]:
        """Counters: commands run, and how many exited non-zero."""
        return dict(self._stats)

    @property
    def hosts_argument(self) -> str:
        """The ``-H`` value of `unisonrun`: ``h0:S0,h1:S1,...``."""
        return ",".join(f"{h}:{s}" for h, s in zip(self.hostnames, self.slots))

    @property
    def launcher_exec(self) -> str:
        """Path of the script mpiexec uses instead of ssh."""
        assert self._dir is not None, "start() first"
        return str(self._dir / "launcher-exec")

    def __enter__(self) -> EmulatedHosts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Create the namespaces, links, addresses, caps, hosts files and launcher script."""
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        _live[self.tag] = self
        self.state = HostsState.STARTING
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        self.state = HostsState.RUNNING

    def _create(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for a, h in zip(self.addresses, self.hostnames))
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            _sh("ip", "netns", "add", ns)
            port = f"p{i}"
            _sh("ip", "link", "add", IFACE, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFACE)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", IFACE, "up")
            _sh("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", port, "up")
            if self.rate_mbit:
                for where, dev in ((ns, IFACE), (self.switch, port)):
                    _sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                        "rate", f"{self.rate_mbit}mbit", "burst", _burst(self.rate_mbit), "latency", "50ms")
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            # No name server is reachable from a namespace: lookups that reached for one failed (torch's
            # c10d warned at every store connection that it could not name the peer's address).
            (etc / "nsswitch.conf").write_text(_nsswitch())
        self._dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        cases = "\n".join(f"  {h}|{a}) ns={n} ;;" for h, a, n in
                          zip(self.hostnames, self.addresses, self.namespaces))
        script = self._dir / "launcher-exec"
        script.write_text(_LAUNCHER_EXEC.format(cases=cases))
        script.chmod(0o755)
        os.chmod(self._dir, 0o755)

    def exec_command(self, host: int, command: Sequence[str]) -> list[str]:
        """The command line that runs `command` in emulated host `host` under its hostname."""
        inner = f"hostname {self.hostnames[host]}; exec {shlex.join(command)}"
        return ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "sh", "-c", inner]

    def unisonrun_command(self, program: Sequence[str], np: int | None = None,
                          unisonrun_args: Sequence[str] = ()) -> list[str]:
        """`unisonrun` across every host (started in host 0) running `program`."""
        total = sum(self.slots) if np is None else np
        return [sys.executable, "-m", "unison.launcher", "-np", str(total), "-H", self.hosts_argument,
                "--launcher-exec", self.launcher_exec, "--iface", IFACE, *unisonrun_args, *program]

    def run(self, program: Sequence[str], np: int | None = None, *, env: Mapping[str, str] | None = None,
            timeout: float = 120.0, unisonrun_args: Sequence[str] = (),
            host: int = 0) -> subprocess.CompletedProcess[str]:
        """Run `program` with `unisonrun` across the hosts (or, with ``np=0``, directly on `host`)."""
        if self.state != HostsState.RUNNING:
            raise RuntimeError(f"{self!r} is not running: use it as a context manager or call start().")
        if np == 0:
            command = self.exec_command(host, program)
        else:
            command = self.exec_command(host, self.unisonrun_command(program, np, unisonrun_args))
        run_env = dict(os.environ)
        run_env.update(env or {})
        log.info("running %s", shlex.join(command))
        done = subprocess.run(command, capture_output=True, text=True, env=run_env, timeout=timeout)
        self._stats["runs"] += 1
        self._stats["failed_runs"] += done.returncode != 0
        return done

    def close(self) -> None:
        """Remove everything `start` created (idempotent)."""
        if self.state == HostsState.CLOSED:
            return
        for ns in [*self.namespaces, self.switch]:
            _remove_namespace(ns)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        _live.pop(self.tag, None)
        self.state = HostsState.CLOSED


def _burst(rate_mbit: float) -> str:
    # tbf needs a bucket of at least rate/HZ; 256 KiB holds 1 Gbit/s at HZ=250 with room to spare.
    return f"{max(256, int(rate_mbit * 1e6 / 8 / 250 / 1024) + 1)}kb"


def _remove_namespace(ns: str) -> None:
    # Killing what still runs inside first: a namespace with live processes keeps its links.
    pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    _sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def _namespaces() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def cleanup(everything: bool = False) -> list[str]:
    """Remove emulated hosts left behind by processes that no longer run (all of them if `everything`).

    Returns the namespaces removed.
    """
    removed = []
    for ns in _namespaces():
        owner = ns[len(PREFIX):].split("-", 1)[0]
        alive = owner.isdigit() and Path(f"/proc/{owner}").exists()
        if everything or not alive:
            _remove_namespace(ns)
            removed.append(ns)
    live = _namespaces()
    for leftover in [*NETNS_ETC.glob(f"{PREFIX}*"), *Path(tempfile.gettempdir()).glob(f"{PREFIX}*")]:
        owner = leftover.name[len(PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or any(ns.startswith(leftover.name[:len(PREFIX) + len(owner)] + "-")
                                      for ns in live):
            continue  # not ours (e.g. unison-multirank-*), or its hosts still exist
        if everything or not Path(f"/proc/{owner}").exists():
            shutil.rmtree(leftover, ignore_errors=True)
    return removed


@atexit.register
def _close_all() -> None:
    for cluster in list(_live.values()):
        cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m unison.testing.hosts``: run a command across emulated hosts, or clean up."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m unison.testing.hosts",
                                description="Run a unisonrun job across emulated hosts (network namespaces).")
    sub = p.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="create hosts, run PROGRAM under unisonrun across them, tear down")
    run.add_argument("--hosts", type=int, default=2)
    run.add_argument("--slots", default="1", help="slots per host: N, or N0,N1,... per host")
    run.add_argument("--rate-mbit", type=float, default=None, help="cap each link (Mbit/s)")
    run.add_argument("--timeout", type=float, default=300.0)
    run.add_argument("program", nargs=argparse.REMAINDER)
    clean = sub.add_parser("cleanup", help="remove emulated hosts whose creator has exited")
    clean.add_argument("--all", action="store_true", help="remove every unison emulated host")
    args = p.parse_args(argv)
    if args.action == "cleanup":
        for ns in cleanup(everything=args.all):
            print(f"removed {ns}")
        return 0
    reason = unavailable_reason()
    if reason:
        print(f"unison.testing.hosts: {reason}", file=sys.stderr)
        return 2
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    slots: int | list[int] = [int(s) for s in args.slots.split(",")] if "," in args.slots else int(args.slots)
    with EmulatedHosts(args.hosts, slots, args.rate_mbit) as cluster:
        done = cluster.run(program, timeout=args.timeout)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
