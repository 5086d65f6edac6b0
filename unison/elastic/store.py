"""Keep a host's newest committed state in shared memory, where it outlives the ranks that wrote it.

One directory per host under the job's store (``/dev/shm/...``): two slot files and a small
``current`` file naming the slot that holds the newest complete commit, its commit number and the
epoch that wrote it. A commit writes into the other slot in place (tmpfs pages already allocated
are reused, so a commit costs about one memory copy), then replaces ``current`` atomically (write a
temporary file, rename). A writer killed halfway leaves ``current`` naming the previous, complete
commit. One writer per host (the first rank of the host); readers read only at the start of an epoch,
before anyone commits.

The writer keeps each slot mapped between commits and copies into the mapping: on tmpfs that costs
about half of a ``pwrite`` of the same bytes (no per-page write calls, no page faults after the
first commit), measured in ``benchmarks/elastic.py``.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._contract import write_atomically

__all__ = ["CommitId", "StateStore"]


@dataclasses.dataclass(frozen=True, order=True)
class CommitId:
    """Which commit: the membership epoch that wrote it, then the number of commits since the job began.

    The order picks the state to restore at the start of a launch: the latest epoch first, because
    every launch starts from the newest commit of its hosts and goes on from there, so a commit of
    a later epoch descends from every commit that launch could see; a host that sat out that launch
    may hold more commits of an older epoch, but those belong to a line of work given up when the
    launch began. Within an epoch, the most commits. Both numbers are unison's own (the driver's
    epoch, the State's private count): no value the user keeps in a State can change the order.
    """

    epoch: int
    commit: int


class StateStore:
    """The commits of one host in one job: `write` (atomic), `newest`, `read`."""

    def __init__(self, directory: str | Path, host: str) -> None:
        self.path = Path(directory) / re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self.writes = 0
        self.bytes_written = 0
        self._maps: dict[int, mmap.mmap] = {}  # slot -> its mapping, kept between commits

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
        return None if current is None else CommitId(epoch=int(current["epoch"]), commit=int(current["commit"]))

    def write(self, commit: CommitId, parts: Sequence[memoryview | bytes]) -> None:
        """Store `parts` (concatenated) as `commit`; the previous commit stays readable until it is done."""
        self.path.mkdir(parents=True, exist_ok=True)
        current = self._current()
        slot = 1 - int(current["slot"]) if current else 0
        views = [memoryview(part).cast("B") for part in parts]
        size = sum(view.nbytes for view in views)
        if size:
            target = np.frombuffer(self._map(slot, size), dtype=np.uint8)
            try:
                at = 0
                for view in views:
                    np.copyto(target[at:at + view.nbytes], np.frombuffer(view, dtype=np.uint8))
                    at += view.nbytes
            finally:  # even on an error: an exported mapping could not be closed at the next size change
                del target
        else:
            self._unmap(slot)
            (self.path / f"slot-{slot}").write_bytes(b"")
        write_atomically(self.path / "current", json.dumps({"commit": commit.commit, "epoch": commit.epoch,
                                                            "slot": slot, "bytes": size}),
                         temporary=self.path / f"current.{os.getpid()}")
        self.writes += 1
        self.bytes_written += size

    def _map(self, slot: int, size: int) -> mmap.mmap:
        """Slot `slot` mapped writable at exactly `size` bytes (the mapping kept from the last commit if it fits)."""
        mapped = self._maps.get(slot)
        if mapped is not None and len(mapped) == size:
            return mapped
        self._unmap(slot)
        fd = os.open(self.path / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            # Reserve the pages now: a full tmpfs then fails here with ENOSPC, where a store into a
            # sparse mapping would kill the process with SIGBUS (no error, no traceback, the host blamed).
            os.posix_fallocate(fd, 0, size)
            mapped = self._maps[slot] = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return mapped

    def _unmap(self, slot: int) -> None:
        mapped = self._maps.pop(slot, None)
        if mapped is not None:
            mapped.close()

    def close(self) -> None:
        """Release the writer's mappings (the files stay)."""
        for slot in list(self._maps):
            self._unmap(slot)

    def read(self) -> tuple[CommitId, bytearray] | None:
        """The newest commit and its bytes (a writable buffer), or None when there is none."""
        current = self._current()
        if current is None:
            return None
        data = bytearray(int(current["bytes"]))
        with open(self.path / f"slot-{int(current['slot'])}", "rb") as f:
            if f.readinto(data) != len(data):
                return None
        return CommitId(epoch=int(current["epoch"]), commit=int(current["commit"])), data
