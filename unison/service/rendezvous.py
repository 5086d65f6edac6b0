"""The rendezvous at the heart of the service: pairs every rank's n-th exchange of each phase.

Every rank's engine runs the same sequence of cycles, so the n-th STATUS exchange of rank 0 belongs with
the n-th STATUS exchange of every other rank (likewise GATHER and BROADCAST). This class holds the
exchanges until the pairing is complete and hands each rank its answer; it knows nothing of gRPC.

One exchange may speak for several ranks (a host's ranks, gathered by their host leader): `ranks`
lists them, lowest first, and carries one part per rank. Rank 0's exchange receives the gather.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence

__all__ = ["JobAborted", "Rendezvous", "pack_parts", "unpack_parts"]


def pack_parts(parts: Sequence[bytes]) -> bytes:
    """Several byte strings as one: a count, the lengths, then the bytes.

    Example:
        >>> unpack_parts(pack_parts([b"ab", b"", b"c"]))
        [b'ab', b'', b'c']
    """
    return struct.pack(f"<I{len(parts)}Q", len(parts), *map(len, parts)) + b"".join(parts)


def unpack_parts(data: bytes) -> list[bytes]:
    """Undo `pack_parts`; raises ValueError on malformed input."""
    if len(data) < 4:
        raise ValueError("packed parts: missing count")
    (count,) = struct.unpack_from("<I", data)
    header = 4 + 8 * count
    if len(data) < header:
        raise ValueError("packed parts: truncated lengths")
    lengths = struct.unpack_from(f"<{count}Q", data, 4)
    if header + sum(lengths) != len(data):
        raise ValueError("packed parts: lengths do not match the data")
    out, offset = [], header
    for length in lengths:
        out.append(data[offset : offset + length])
        offset += length
    return out


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
        >>> r.status([0], 0, [b"row"])
        b'row'
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, int], _Slot] = {}
        self._abort = ""
        self._closed = ""  # the service stopped: exchanges that are not complete end with this
        self._waiting: dict[int, str] = {}  # rank -> what it is blocked on (for status)

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

    def close(self, reason: str) -> None:
        """Release every exchange still waiting for partners with `JobAborted(reason)`, and refuse new
        ones; unlike `abort`, exchanges already complete still return their answer."""
        with self._cond:
            if not self._closed:
                self._closed = reason
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
                if self._abort or self._closed:
                    raise JobAborted(self._abort or self._closed)
                self._cond.wait(1.0)
        finally:
            self._waiting.pop(rank, None)
        if self._abort:
            raise JobAborted(self._abort)

    def status(self, ranks: Sequence[int], sequence: int, rows: Sequence[bytes]) -> bytes:
        """Deposit these ranks' status rows; return every rank's rows concatenated in rank order."""
        key = ("status", sequence)
        with self._cond:
            slot = self._slot(key)
            for rank, row in zip(ranks, rows):
                slot.parts[rank] = row
            slot.count += len(ranks)
            if slot.count == self.size:
                slot.value = b"".join(p or b"" for p in slot.parts)
                self._cond.notify_all()
            self._wait(ranks[0], f"status exchange {sequence}", lambda: slot.value is not None)
            slot.reads += len(ranks)
            if slot.reads == self.size:
                del self._slots[key]
            assert isinstance(slot.value, bytes)
            return slot.value

    def gather(self, ranks: Sequence[int], sequence: int, payloads: Sequence[bytes]) -> list[bytes] | None:
        """Deposit payloads; the exchange holding rank 0 waits for and receives all of them, the
        others return at once."""
        key = ("gather", sequence)
        with self._cond:
            slot = self._slot(key)
            for rank, payload in zip(ranks, payloads):
                slot.parts[rank] = payload
            slot.count += len(ranks)
            if slot.count == self.size:
                self._cond.notify_all()
            if ranks[0] != 0:
                return None
            self._wait(0, f"request gather {sequence}", lambda: slot.count == self.size)
            del self._slots[key]
            return [p or b"" for p in slot.parts]

    def broadcast(self, ranks: Sequence[int], sequence: int, payload: bytes) -> bytes:
        """The exchange holding rank 0 deposits its payload and returns; the others wait for it."""
        key = ("broadcast", sequence)
        with self._cond:
            slot = self._slot(key)
            if ranks[0] == 0:
                slot.value = payload
                self._cond.notify_all()
            else:
                self._wait(ranks[0], f"response broadcast {sequence}", lambda: slot.value is not None)
            slot.reads += len(ranks)
            if slot.reads == self.size:
                del self._slots[key]
            assert isinstance(slot.value, bytes)
            return slot.value
