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

Every rank restores the newest commit by unpickling it, so the store is trusted only when no one else
can write it: the store directory and the host's directory are made with mode 0700, and a directory
that another user owns, that group or others can write, or that is a symbolic link is refused with a
`ConfigError` naming it, its owner and its mode (another user could have made the path first on a
host that joins the job). A ``current`` that is not a commit pointer is refused the same way.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._contract import untrusted_directory, user_name, write_atomically
from ..errors import ConfigError

__all__ = ["CommitId", "StateStore", "check_private"]

_POINTER_KEYS = ("commit", "epoch", "slot", "bytes")


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


def check_private(path: Path) -> bool:
    """Whether directory `path` is there; refuse it unless this user owns it and only this user can write it.

    Raises:
        ConfigError: `path` is a symbolic link, not a directory, owned by another user, or writable by
            group or others; the message names its owner and mode.
    """
    try:
        problem = untrusted_directory(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if problem is None:
        return True
    raise ConfigError(
        f"The elastic store directory {path} {problem}. "
        f"Every rank unpickles the commits found there, so it must be a directory owned by "
        f"{user_name(os.getuid())} that group and others cannot write. Remove it, or give the job another "
        "UNISON_ELASTIC_STORE.")


def _make_private(path: Path) -> None:
    """Make directory `path` with mode 0700 unless it is there, then check it (whoever made it)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass  # there already, or made in between: checked next either way
    check_private(path)


class StateStore:
    """The commits of one host in one job: `write` (atomic), `newest`, `read`."""

    def __init__(self, directory: str | Path, host: str) -> None:
        self.root = Path(directory)
        self.path = self.root / re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self.writes = 0
        self.bytes_written = 0
        self._maps: dict[int, mmap.mmap] = {}  # slot -> its mapping, kept between commits

    def __repr__(self) -> str:
        return f"StateStore({str(self.path)!r}, writes={self.writes})"

    def statistics(self) -> dict[str, int]:
        return {"writes": self.writes, "bytes_written": self.bytes_written}

    def _there(self) -> bool:
        """Whether this host's directory is there, checked private with the store's (`check_private`)."""
        return check_private(self.root) and check_private(self.path)

    def _current(self) -> dict[str, int] | None:
        """The commit pointer; None when there is none, or it cannot be read, or is not a JSON object.

        Raises:
            ConfigError: an object without the pointer's keys, or with values that are not what they must be.
        """
        try:
            value = json.loads((self.path / "current").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict):
            return None
        fields: dict[str, Any] = {key: value.get(key) for key in _POINTER_KEYS}
        if all(type(v) is int and v >= 0 for v in fields.values()) and fields["slot"] in (0, 1):
            return fields
        raise ConfigError(
            f"{self.path / 'current'} is not a commit pointer of unison's elastic store: it must be a JSON "
            f"object of {list(_POINTER_KEYS)}, integers >= 0 and slot 0 or 1. Got {json.dumps(value)[:200]}. "
            f"Remove {self.path} to start this host from no commit.")

    def newest(self) -> CommitId | None:
        """The newest complete commit on this host, or None.

        Raises:
            ConfigError: the store is not private to this user (`check_private`), or ``current`` is not a
                commit pointer.
        """
        if not self._there():
            return None
        current = self._current()
        return None if current is None else CommitId(epoch=current["epoch"], commit=current["commit"])

    def write(self, commit: CommitId, parts: Sequence[memoryview | bytes]) -> None:
        """Store `parts` (concatenated) as `commit`; the previous commit stays readable until it is done.

        Raises:
            ConfigError: the store or the host's directory was there, not private to this user.
        """
        if not check_private(self.root):
            self.root.parent.mkdir(parents=True, exist_ok=True)
            _make_private(self.root)
        if not check_private(self.path):
            _make_private(self.path)
        current = self._current()
        slot = 1 - current["slot"] if current else 0
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
        """The newest commit and its bytes (a writable buffer), or None when there is none.

        Raises:
            ConfigError: as `newest`.
        """
        if not self._there():
            return None
        current = self._current()
        if current is None:
            return None
        data = bytearray(current["bytes"])
        with open(self.path / f"slot-{current['slot']}", "rb") as f:
            if f.readinto(data) != len(data):
                return None
        return CommitId(epoch=current["epoch"], commit=current["commit"]), data
