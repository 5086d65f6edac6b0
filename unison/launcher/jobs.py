"""Running unisonrun jobs of this user, and `unisonrun --status`: the live table of one of them.

unisonrun records each job it starts in a private per-user directory (``$XDG_RUNTIME_DIR/unison``,
else ``/tmp/unison-<uid>``, mode 0700): its pid, launcher directory and command. When the job runs
the coordinator service (``UNISON_CONTROLLER=grpc``), rank 0 writes the service's address and the
job's secret into the launcher directory (a 0600 file), so ``unisonrun --status`` needs no address
and no secret from the user. Either way ``--status`` then prints the main-thread stack of each rank on
this host (`stacks`: asked for with SIGUSR2). Nothing is written anywhere else; the record goes when unisonrun ends.

An elastic job's record names its shared-memory store as its directory and carries an ``elastic``
part that the driver rewrites (atomically) whenever its state changes: the running epoch, its hosts
and launcher directory, the resets, the blacklist and what discovery offers. ``--status`` prints
that, the newest commit found in the store, and the running epoch's live table when there is one.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._contract import SERVICE_FILE, write_atomically
from ..errors import LaunchError
from .supervision.deaths import alive

if TYPE_CHECKING:
    from ..elastic.membership import Host, Membership

__all__ = ["ElasticRecord", "elastic_lines", "register", "registry_dir", "running_jobs", "show_status", "update"]


def registry_dir(create: bool = True) -> Path:
    """The per-user directory of job records; refused if another user owns it or others can enter."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "unison" if base else Path(tempfile.gettempdir()) / f"unison-{os.getuid()}"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists():
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise LaunchError(
                f"{path} must be a directory owned by you and private (mode 0700); it is owned by uid "
                f"{info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}. Remove it and retry."
            )
    return path


def register(directory: str, command: Sequence[str], np: int, **extra: object) -> Path | None:
    """Record a starting job; returns the record to remove at the end (None if it could not be written).

    `extra` fields (JSON values) are stored beside the others: an elastic job's ``elastic`` part.
    """
    try:
        record = registry_dir() / f"{os.getpid()}.json"
        _write_record(record, {"pid": os.getpid(), "dir": directory, "np": np, "command": list(command),
                               "started": time.time(), **extra})
        return record
    except (OSError, LaunchError):
        return None  # status lookups are a convenience; never stop a job over them


def update(record: Path | None, **fields: object) -> None:
    """Replace fields of a job's record (atomically: `--status` may read it at any moment)."""
    if record is None:
        return
    try:
        job = json.loads(record.read_text())
        job.update(fields)
        _write_record(record, job)
    except (OSError, ValueError):
        pass  # the record is gone or damaged: status lookups are a convenience


def _write_record(record: Path, job: dict[str, Any]) -> None:
    write_atomically(record, json.dumps(job), temporary=record.with_name(f".{record.name}.{threading.get_ident()}"))


def running_jobs() -> list[dict[str, Any]]:
    """This user's running unisonrun jobs, oldest first; records of dead launchers are removed."""
    directory = registry_dir(create=False)
    if not directory.exists():
        return []
    jobs = []
    for record in directory.glob("*.json"):
        try:
            job = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if alive(int(job.get("pid", 0))) and os.path.isdir(job.get("dir", "")):
            jobs.append(job)
        else:
            record.unlink(missing_ok=True)
    return sorted(jobs, key=lambda j: j["started"])


class ElasticRecord:
    """An elastic job's record, rewritten by the driver whenever its state changes (epoch, waiting, blacklist)."""

    def __init__(self, store: str, program: Sequence[str], membership: Membership, lock: threading.Lock) -> None:
        self.membership = membership
        self.lock = lock  # the driver's lock around the membership, not held by the callers
        self.fields: dict[str, object] = {"epoch": None, "np": 0, "hosts": "", "epoch_started": None,
                                          "running": False, "launcher_dir": "", "waiting": "", "resets": 0,
                                          "failures": 0, "blacklist": {}, "discovered": ""}
        self.record = register(store, program, 0, elastic=self.fields)

    def __repr__(self) -> str:
        return f"<ElasticRecord {self.record} epoch={self.fields['epoch']} running={self.fields['running']}>"

    def publish(self, discovered: Sequence[Host] | None = None, **changes: object) -> None:
        """Rewrite the record with `changes`, the membership's resets and blacklist, and `discovered`."""
        if self.record is None:
            return
        with self.lock:
            self.fields.update(changes)
            if discovered is not None:
                self.fields["discovered"] = ", ".join(f"{h.name}:{h.slots}" for h in discovered)
            monotonic, wall = time.monotonic(), time.time()
            self.fields["resets"] = self.membership.resets
            self.fields["blacklist"] = {name: [None if math.isinf(left) else wall + left, why]
                                        for name, (left, why) in self.membership.blacklisted(monotonic).items()}
            update(self.record, np=self.fields["np"], elastic=self.fields)

    def remove(self) -> None:
        if self.record is not None:
            self.record.unlink(missing_ok=True)


def _describe(job: dict[str, Any]) -> str:
    age = time.time() - job["started"]
    elastic = job.get("elastic")
    kind = f"  elastic, epoch {elastic.get('epoch')}" if isinstance(elastic, dict) else ""
    return f"  pid {job['pid']:>7}  {job['np']} ranks{kind}  {age:>7.0f} s  {' '.join(job['command'])[:70]}"


def _newest_commit(store: str) -> tuple[tuple[int, int, str] | None, list[str]]:
    """The newest commit in an elastic job's store on this host (in restore order, `CommitId`'s):
    (commit, epoch, host) or None; and why each host's store that could not be read was refused (one
    another user could have written, a malformed pointer: `StateStore`'s errors)."""
    from ..elastic.store import CommitId, StateStore

    newest: tuple[CommitId, str] | None = None
    refused: list[str] = []
    try:
        hosts = sorted(entry.name for entry in os.scandir(store) if entry.is_dir())
    except OSError:
        return None, refused
    for host in hosts:
        try:
            found = StateStore(store, host).newest()
        except (OSError, ValueError) as exc:
            refused.append(f"{host}: {exc}")
            continue
        if found is not None and (newest is None or found > newest[0]):
            newest = (found, host)
    return (None if newest is None else (newest[0].commit, newest[0].epoch, newest[1])), refused


def elastic_lines(job: dict[str, Any], now: float) -> list[str]:
    """What `unisonrun --status` says of an elastic job (its record's ``elastic`` part), before any table."""
    e = job["elastic"]
    lines = [f"unisonrun elastic job {job['pid']}: {' '.join(job['command'])}"]
    if e.get("epoch") is None:
        lines.append("  no epoch started yet")
    elif e.get("running"):
        lines.append(f"  epoch {e['epoch']}: {e['np']} ranks on {e['hosts']}, started "
                     f"{now - e['epoch_started']:.0f} s ago")
    else:
        lines.append(f"  epoch {e['epoch']} ended (it ran {e['np']} ranks on {e['hosts']}); the next is not "
                     "started yet")
    if e.get("waiting"):
        lines.append(f"  waiting for hosts: {e['waiting']}")
    newest, refused = _newest_commit(job["dir"])
    commits = (f"commit {newest[0]} (written in epoch {newest[1]}, newest on {newest[2]})" if newest
               else "none yet")
    lines.append(f"  commits: {commits}; resets: {e['resets']} ({e['failures']} after a failure)")
    lines.extend(f"  store refused: {why}" for why in refused)
    blacklisted = []
    for host, (until, why) in sorted(e.get("blacklist", {}).items()):
        if until is None:
            blacklisted.append(f"{host} for good ({why})")
        elif until > now:
            blacklisted.append(f"{host} for {until - now:.1f} s more ({why})")
    lines.append(f"  blacklisted: {'; '.join(blacklisted) or 'none'}")
    lines.append(f"  discovered: {e.get('discovered') or 'nothing yet'}")
    return lines


def show_status(target: str, timeout: float = 5.0) -> int:
    """`unisonrun --status [PID|HOST:PORT]`: print the live table; returns the exit status."""
    from ..status import main as status_main

    if ":" in target:
        return status_main([target, "--timeout", str(timeout)])
    jobs = running_jobs()
    if target:
        jobs = [j for j in jobs if str(j["pid"]) == target]
        if not jobs:
            raise LaunchError(f"No running unisonrun job has pid {target}. `unisonrun --status` lists them.")
    if not jobs:
        raise LaunchError("No unisonrun job of yours is running on this host.")
    if len(jobs) > 1:
        listing = "\n".join(_describe(j) for j in jobs)
        raise LaunchError(f"{len(jobs)} unisonrun jobs are running; name one: unisonrun --status PID\n{listing}")
    job = jobs[0]
    elastic = job.get("elastic")
    if isinstance(elastic, dict):
        print("\n".join(elastic_lines(job, time.time())), flush=True)
        service = Path(elastic.get("launcher_dir") or job["dir"]) / SERVICE_FILE
        if not service.exists():
            print("  (no live rank table: the running epoch has no coordinator service; start the job with "
                  "UNISON_CONTROLLER=grpc for one)", flush=True)
            _print_stacks(service.parent)
            return 0
        status = _table(service, timeout)
        _print_stacks(service.parent)
        return status
    service = Path(job["dir"]) / SERVICE_FILE
    if not service.exists():
        _print_stacks(Path(job["dir"]))
        raise LaunchError(
            f"Job {job['pid']} runs no coordinator service to ask for its live table (or its rank 0 is on another "
            "host): start it with UNISON_CONTROLLER=grpc for one, or use python -m unison.status HOST:PORT."
        )
    print(f"unisonrun job {job['pid']}: {' '.join(job['command'])}", file=sys.stderr)
    status = _table(service, timeout)
    _print_stacks(Path(job["dir"]))
    return status


def _print_stacks(directory: Path) -> None:
    """Print the main-thread stack of each of the job's ranks on this host (`stacks`)."""
    from .stacks import ask_stacks

    lines = ask_stacks(directory)
    if lines:
        print("\n".join(lines), flush=True)


def _table(service: Path, timeout: float) -> int:
    """Print the live table of the job's coordinator service (its address and secret in `service`)."""
    from ..status import main as status_main

    try:
        info = json.loads(service.read_text())
    except (OSError, ValueError):  # the launch ended (its directory went) between the look and the read
        print("  (no live rank table: the launch that had one has just ended; ask again)", flush=True)
        return 0
    os.environ["UNISON_SECRET"] = info["secret"]
    os.environ.pop("UNISON_SECRET_FILE", None)
    return status_main([info["address"], "--timeout", str(timeout)])
