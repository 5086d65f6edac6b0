"""The rendezvous at the heart of the service: pairs every rank's n-th exchange of each phase.

Every rank's engine runs the same sequence of cycles, so the n-th STATUS exchange of rank 0 belongs with
the n-th STATUS exchange of every other rank (likewise GATHER and BROADCAST). This class holds the
exchanges until the pairing is complete and hands each rank its answer; it knows nothing of gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["JobAborted", "Rendezvous"]


class JobAborted(Exception):
    """The job is being aborted; the message says why."""


class _Slot:
    __slots__ = ("count", "parts", "reads", "value")

    def __init__(self, size: int) -> None:
        self.parts: list[bytes | None] = [None] * size
        self.count = 0
        self.reads = 0
        self.value: bytes | list[bytes] | None = None


class Rendezvous:
    """Pairs exchanges by (phase, sequence) among `size` ranks; rank 0 is the coordinator's rank.

    Example:
        >>> r = Rendezvous(1)
        >>> r.status(0, 0, b"row")
        b'row'
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, int], _Slot] = {}
        self._abort = ""
        self._waiting: dict[int, str] = {}  # rank -> what it is blocked on (for status)
        self.exchanges = 0

    def __repr__(self) -> str:
        return f"<Rendezvous size={self.size} open={len(self._slots)} aborted={bool(self._abort)}>"

    @property
    def aborted(self) -> str:
        """The abort reason, or ''."""
        return self._abort

    def abort(self, reason: str) -> None:
        """Release every waiter with `JobAborted(reason)`; the first reason wins."""
        with self._cond:
            if not self._abort:
                self._abort = reason
            self._cond.notify_all()

    def blocked(self) -> dict[int, str]:
        """Ranks currently waiting in an exchange, and on what."""
        with self._cond:
            return dict(self._waiting)

    def _slot(self, key: tuple[str, int]) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(self.size)
        return slot

    def _wait(self, rank: int, what: str, ready: Callable[[], bool]) -> None:
        self._waiting[rank] = what
        try:
            while not ready():
                if self._abort:
                    raise JobAborted(self._abort)
                self._cond.wait(1.0)
        finally:
            self._waiting.pop(rank, None)
        if self._abort:
            raise JobAborted(self._abort)

    def status(self, rank: int, sequence: int, row: bytes) -> bytes:
        """Deposit this rank's status row; return every rank's rows concatenated in rank order."""
        key = ("status", sequence)
        with self._cond:
            self.exchanges += 1
            slot = self._slot(key)
            slot.parts[rank] = row
            slot.count += 1
            if slot.count == self.size:
                slot.value = b"".join(p or b"" for p in slot.parts)
                self._cond.notify_all()
            self._wait(rank, f"status exchange {sequence}", lambda: slot.value is not None)
            slot.reads += 1
            if slot.reads == self.size:
                del self._slots[key]
            assert isinstance(slot.value, bytes)
            return slot.value

    def gather(self, rank: int, sequence: int, payload: bytes) -> list[bytes] | None:
        """Deposit a payload; rank 0 waits for and receives all of them, other ranks return at once."""
        key = ("gather", sequence)
        with self._cond:
            self.exchanges += 1
            slot = self._slot(key)
            slot.parts[rank] = payload
            slot.count += 1
            if slot.count == self.size:
                self._cond.notify_all()
            if rank != 0:
                return None
            self._wait(rank, f"request gather {sequence}", lambda: slot.count == self.size)
            del self._slots[key]
            return [p or b"" for p in slot.parts]

    def broadcast(self, rank: int, sequence: int, payload: bytes) -> bytes:
        """Rank 0 deposits its payload and returns; the others wait for it."""
        key = ("broadcast", sequence)
        with self._cond:
            self.exchanges += 1
            slot = self._slot(key)
            if rank == 0:
                slot.value = payload
                self._cond.notify_all()
            else:
                self._wait(rank, f"response broadcast {sequence}", lambda: slot.value is not None)
            slot.reads += 1
            if slot.reads == self.size:
                del self._slots[key]
            assert isinstance(slot.value, bytes)
            return slot.value
