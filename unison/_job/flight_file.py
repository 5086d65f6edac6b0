"""This rank's flight record on disk: where it goes, and the file written when the job stops badly.

When the job stalls, deadlocks or a rank fails (the engine stops with a `StallError`, an `AbortedError`
or an internal failure; not for an error every rank raised alike, such as a mismatch, whose message
names the calls already), every rank writes the last collectives it submitted (`unison.engine.flight`)
to ``flight-<rank>.json`` in one directory:

* ``UNISON_FLIGHT_DIR`` when set;
* under unisonrun, the launcher's directory on its host, from which unisonrun moves the records to
  its ``--output-filename`` directory, or to a new one, and says where;
* otherwise ``unison-flight-<user>/<parent pid>`` in the system's temporary directory: the ranks one
  launcher started on a host (mpiexec's proxy, torchrun's agent) share their parent.

The file is JSON (docs/wire-formats.md): ``{"format": FORMAT, "rank", "size", "host", "pid",
"written" (wall clock), "reason" (the stop's first line), "capacity", "entries": [...]}``, each entry
``{"name", "kind", "shape", "dtype", "set", "state" (pending, done, failed), "taken", "finished"
(wall clock; null while pending), "site"}``, oldest first. `python -m unison.launcher.flight DIR`
shows the ranks side by side.
"""

from __future__ import annotations

import getpass
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .._contract import write_atomically
from ..engine.flight import record_of

if TYPE_CHECKING:
    from ..engine.loop import Engine

__all__ = ["FORMAT", "default_directory", "file_name", "write_record"]

FORMAT = "unison flight record 1"


def file_name(rank: int) -> str:
    """The name of `rank`'s record in its directory.

    Example:
        >>> file_name(3)
        'flight-3.json'
    """
    return f"flight-{rank}.json"


def default_directory(flight_dir: str, launcher_dir: Path | None) -> Path:
    """Where this rank writes its record: ``UNISON_FLIGHT_DIR``, the launcher's directory, or the default."""
    if flight_dir:
        return Path(flight_dir)
    if launcher_dir is not None:
        return launcher_dir
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Path(tempfile.gettempdir()) / f"unison-flight-{user}" / str(os.getppid())


def write_record(engine: Engine, directory: Path, rank: int, size: int, host: str, reason: str) -> Path | None:
    """Write this rank's flight record into `directory` (made if needed, mode 0700); return its path, or
    None when there is nothing to write or it could not be written (a report, never a new failure)."""
    record = record_of(engine)
    if not record.capacity:
        return None
    offset = time.time() - time.monotonic()
    data = {"format": FORMAT, "rank": rank, "size": size, "host": host, "pid": os.getpid(),
            "written": time.time(), "reason": reason.strip().splitlines()[0] if reason.strip() else "",
            "capacity": record.capacity, "entries": record.snapshot(offset)}
    path = directory / file_name(rank)
    try:
        if not directory.is_dir():
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            directory.mkdir(mode=0o700, exist_ok=True)
        write_atomically(path, json.dumps(data, separators=(",", ":")) + "\n")
    except (OSError, ValueError):
        return None
    return path
