"""What the launcher decides about parameter servers, from plain data: where each runs, what to do when one ends.

Placement: without hosts every server runs on this host, on loopback; with hosts, server ``i`` runs on
the ``i % H``-th distinct host in the order given (round robin). A server process that ends is either
done by its own rule, started again from its checkpoint, or lost (`server_exit`). `servers` acts on
these answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ...errors import LaunchError
from ..hosts.reach import local_names

__all__ = ["ENDED_STATUSES", "RESTARTS", "Placement", "hosts_of", "place_servers", "server_exit", "spans_hosts"]

RESTARTS = 3  # a lost server is started again at most this many times
ENDED_STATUSES = (0, 3)  # a server's own end: every trainer finished, or the rest were lost (LOST_EXIT_STATUS)


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


def spans_hosts(placements: Sequence[Placement], hosts: Sequence[str], this_host: str) -> bool:
    """Whether trainers may run elsewhere than here (then servers listen on every interface)."""
    here = local_names(this_host)
    return any(not p.local for p in placements) or any(h not in here for h in hosts)


def server_exit(code: int, *, restarts: int, checkpoint_dir: str, limit: int = RESTARTS) -> str:
    """What the launcher does about a server process that ended with `code` (negative: a signal).

    ``"ended"``: the server's own end (`ENDED_STATUSES`); ``"restart"``: it died, and the job keeps
    checkpoints to resume from, and it has been restarted fewer than `limit` times; ``"lost"``: it
    died and stays down.

    Example:
        >>> server_exit(3, restarts=0, checkpoint_dir=""), server_exit(-9, restarts=0, checkpoint_dir="/ck")
        ('ended', 'restart')
        >>> server_exit(-9, restarts=0, checkpoint_dir=""), server_exit(1, restarts=3, checkpoint_dir="/ck")
        ('lost', 'lost')
    """
    if code in ENDED_STATUSES:
        return "ended"
    return "restart" if checkpoint_dir and restarts < limit else "lost"
