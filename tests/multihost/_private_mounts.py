"""Give emulated hosts file systems of their own where a test needs them to differ from the launcher's.

Emulated hosts share the machine's file system. A test that needs a remote host to lack what the
launcher's host has (its /dev/shm, its /tmp) mounts a tmpfs there in a persistent mount namespace per
host, held by a sleeping process, and starts the host's processes through a launcher-exec that enters
that namespace before handing over to the cluster's own launcher-exec.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["launcher_exec_into", "private_mounts"]

# Mpiexec calls it as `SCRIPT [ssh options] HOST COMMAND...`.
_LAUNCHER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
holder=""
{before}
case "$host" in
{cases}
esac
if [ -n "$holder" ]; then
  exec nsenter --target="$holder" --mount -- {real} "$host" "$@"
fi
exec {real} "$host" "$@"
"""


@contextlib.contextmanager
def private_mounts(hosts: Sequence[str], mount_point: str) -> Iterator[dict[str, int]]:
    """A mount namespace per host with a tmpfs of its own on `mount_point`; yields host -> holder pid
    (``nsenter --target PID --mount`` enters it)."""
    holders: dict[str, subprocess.Popen[str]] = {}
    try:
        for host in hosts:
            holders[host] = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f"mount -t tmpfs -o size=64m,mode=1777 tmpfs {mount_point} && echo ready && exec sleep 600"],
                stdout=subprocess.PIPE, text=True)
            assert holders[host].stdout is not None and holders[host].stdout.readline() == "ready\n"
        yield {host: holder.pid for host, holder in holders.items()}
    finally:
        for holder in holders.values():
            holder.kill()
            holder.communicate(timeout=30)


def launcher_exec_into(path: Path, holders: Mapping[str, int], real: str, before: str = "") -> str:
    """Write at `path` a launcher-exec that runs each host's commands in its namespace (hosts without
    a holder: as `real` would); `before` is shell run first, with ``$host`` and ``$*`` set.

    `real` is copied beside `path`: it may live in a directory the private mounts hide (/tmp).
    """
    cases = "\n".join(f"  {host}) holder={pid} ;;" for host, pid in holders.items())
    copy = path.with_name(f"{path.name}.cluster")
    shutil.copy2(real, copy)
    path.write_text(_LAUNCHER.format(before=before, cases=cases, real=copy))
    path.chmod(0o755)
    return str(path)
