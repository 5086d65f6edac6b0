"""Keep a host's newest committed state in shared memory, where it outlives the ranks that wrote it.

One directory per host under the job's store (``/dev/shm/...``): two slot files and a small
``current`` file naming the slot that holds the newest complete commit, its commit number and the
epoch that wrote it. A commit writes into the other slot in place (tmpfs pages already allocated
are reused, so a commit costs about one memory copy), then replaces ``current`` atomically (write a
temporary file, rename). A writer killed halfway leaves ``current`` naming the previous, complete
commit. One writer per host (the first rank of the host); readers read only at the start of an epoch,
before anyone commits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CommitId", "StateStore"]


@dataclasses.dataclass(frozen=True, order=True)
class CommitId:
    """Which commit: the number of commits since the job began, then the epoch that wrote it.

    The order picks the newest state to restore: the most commits, and between equal numbers the
    later epoch (an older epoch's commit of that number belongs to a line of work given up since).
    """

    commit: int
    epoch: int


class StateStore:
    """The commits of one host in one job: `write` (atomic), `newest`, `read`."""

    def __init__(self, directory: str | Path, host: str) -> None:
        self.path = Path(directory) / re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self.writes = 0
        self.bytes_written = 0

    def __repr__(self) -> str:
        return f"StateStore({str(self.path)!r}, writes={self.writes})"

    def statistics(self) -> dict[str, int]:
        return {"writes": self.writes, "bytes_written": self.bytes_written}

    def _current(self) -> dict[str, int] | None:
        try:
            value = json.loads((self.path / "current").read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def newest(self) -> CommitId | None:
        """The newest complete commit on this host, or None."""
        current = self._current()
        return None if current is None else CommitId(int(current["commit"]), int(current["epoch"]))

    def write(self, commit: CommitId, parts: Sequence[memoryview | bytes]) -> None:
        """Store `parts` (concatenated) as `commit`; the previous commit stays readable until it is done."""
        self.path.mkdir(parents=True, exist_ok=True)
        current = self._current()
        slot = 1 - int(current["slot"]) if current else 0
        size = 0
        fd = os.open(self.path / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while view.nbytes:
                    written = os.pwrite(fd, view, size)
                    size += written
                    view = view[written:]
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        temporary = self.path / f"current.{os.getpid()}"
        temporary.write_text(json.dumps({"commit": commit.commit, "epoch": commit.epoch,
                                         "slot": slot, "bytes": size}))
        os.replace(temporary, self.path / "current")
        self.writes += 1
        self.bytes_written += size

    def read(self) -> tuple[CommitId, bytearray] | None:
        """The newest commit and its bytes (a writable buffer), or None when there is none."""
        current = self._current()
        if current is None:
            return None
        data = bytearray(int(current["bytes"]))
        with open(self.path / f"slot-{int(current['slot'])}", "rb") as f:
            if f.readinto(data) != len(data):
                return None
        return CommitId(int(current["commit"]), int(current["epoch"])), data
