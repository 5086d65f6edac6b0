"""What the elastic driver does about hosts and their stores: probe them, name them, clean them.

`store_directory` makes the job's shared-memory store on this host (removed by a reaper if the driver
is killed); `unreachable` runs ``true`` on a failed epoch's remote hosts the way mpiexec reaches them, to find
those that vanished; `remove_remote_stores` removes the job's shared-memory store on the remote
hosts that ran ranks; `blacklisting` is the log's account of whom the driver blacklisted and why;
`as_elastic_host` names a failed rank by the elastic host it ran as.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence

from ..._contract import ELASTIC_STORE_VARIABLE
from ...elastic.membership import Epoch, Membership
from ..hosts.reach import Reach, local_names, run_on_hosts
from ..supervision.reaper import JobDirectory
from .discovery import say

__all__ = ["PROBE_TIMEOUT_SECONDS", "as_elastic_host", "blacklisting", "is_local", "remove_remote_stores",
           "store_directory", "unreachable"]

PROBE_TIMEOUT_SECONDS = 10.0


def is_local(name: str) -> bool:
    """Whether host `name` is this machine."""
    return name in local_names()


def store_directory() -> JobDirectory:
    """The job's store directory on this host (in /dev/shm where it can), a `JobDirectory` to enter."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return JobDirectory(f"unison-elastic-{os.getuid()}-", base=base, variable=ELASTIC_STORE_VARIABLE)


def unreachable(epoch: Epoch, blamed: Sequence[str], reach: Reach, env: dict[str, str]) -> dict[str, str]:
    """After a failed launch: the epoch's remote hosts (not already blamed) where mpiexec's launcher
    cannot even run ``true`` now, each with what the launcher said."""
    hosts = [host.name for host in epoch.hosts if not is_local(host.name) and host.name not in blamed]
    if not hosts or not reach.usable:
        return {}
    found = {}
    answers = run_on_hosts(reach, hosts, "true", env, PROBE_TIMEOUT_SECONDS)
    for answer in answers:
        what = answer.describe(shlex.join(reach.command(answer.host, "true")))
        if not answer.started:  # our own launcher program is missing: no host is to blame for that
            say(f"could not check whether {answer.host} is reachable: {what}")
        elif not answer.ok:
            found[answer.host] = what
    said = {(a.returncode, a.output.replace(a.host, "HOST")) for a in answers}
    if len(answers) > 1 and len(found) == len(answers) and len(said) == 1:
        # Every host failing alike points at this host (its ssh keys, DNS, network), not at them.
        say(f"none of {', '.join(hosts)} could be reached, all alike ({found[hosts[0]]}); that looks like "
            "a problem of this host, so none is blacklisted for it")
        return {}
    return found


def remove_remote_stores(hosts: Sequence[str], store: str, reach: Reach, env: dict[str, str]) -> None:
    """Remove the job's store directory on each remote host that ran ranks (best effort, logged)."""
    remote = [name for name in hosts if not is_local(name)]
    if not remote:
        return
    if not reach.usable:
        say(f"left the job's store {store} on {', '.join(remote)}: --mpi-args choose how mpiexec reaches "
            "them, which the driver cannot follow; remove it there")
        return
    command = f"rm -rf -- {shlex.quote(store)}"
    for answer in run_on_hosts(reach, remote, command, env, PROBE_TIMEOUT_SECONDS):
        if not answer.ok:
            say(f"could not remove the job's store {store} on {answer.host}: "
                + answer.describe(shlex.join(reach.command(answer.host, command))))


def as_elastic_host(epoch: Epoch, rank: int, why: str) -> str:
    """`why` (a failed rank's reason) naming `rank` by the elastic host it ran as, not the machine's name.

    Example:
        >>> from unison.elastic.membership import Host
        >>> as_elastic_host(Epoch(3, (Host("127.0.0.1", 1), Host("localhost", 1))), 1,
        ...                 "rank 1 (vm, pid 42) failed: ValueError: bad")
        'rank 1 (localhost, pid 42) failed: ValueError: bad'
    """
    prefix = f"rank {rank} ("
    if not why.startswith(prefix) or not 0 <= rank < epoch.np:
        return why
    machine, sep, rest = why[len(prefix):].partition(", pid ")
    return f"{prefix}{epoch.host_of(rank)}{sep}{rest}" if sep and ")" not in machine else why


def blacklisting(membership: Membership, blamed: dict[str, str], now: float) -> str:
    """The log's account of whom the driver blacklisted, for how long, and why."""
    parts = []
    for name, why in blamed.items():
        left = membership.blacklist.get(name, now) - now
        count = membership.blacklistings.get(name, 1)
        duration = ("for good" if math.isinf(left) else
                    f"for {left:.1f} s (failure {count} of this host; --blacklist-cooldown-range backs off)")
        parts.append(f"{name} {duration} ({why})")
    return "; blacklisting " + ", ".join(parts) if parts else ""
