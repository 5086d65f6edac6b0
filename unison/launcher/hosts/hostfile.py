"""Host lists as users write them (``-H a:2,b``, a hostfile's ``a slots=2``): parsed into (host, slots)."""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import InvalidArgumentError

__all__ = ["parse_hosts", "read_hostfile"]


def parse_hosts(entries: Iterable[str], where: str) -> list[tuple[str, int]]:
    """``host``, ``host:N`` and hostfile lines ``host slots=N`` as (host, slots); 1 slot when unsaid.

    Example:
        >>> parse_hosts(["localhost:2", "127.0.0.1 slots=3", "box"], "hosts")
        [('localhost', 2), ('127.0.0.1', 3), ('box', 1)]
    """
    hosts = []
    for raw in entries:
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        host, slots = entry, "1"
        if "slots=" in entry:
            host, _, slots = entry.partition("slots=")
        elif entry.count(":") == 1:
            host, _, slots = entry.partition(":")
        host = host.strip()
        if not host or not slots.strip().isdigit() or int(slots) < 1:
            raise InvalidArgumentError(
                f"{where}: each host is NAME, NAME:SLOTS or (in a hostfile) NAME slots=SLOTS, with "
                f"SLOTS >= 1. Got {raw.strip()!r}."
            )
        hosts.append((host, int(slots)))
    return hosts


def read_hostfile(path: str) -> list[str]:
    """The lines of hostfile `path` (for `parse_hosts`)."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError as exc:
        raise InvalidArgumentError(f"hostfile={path!r} could not be read: {exc}.") from exc
