"""Give each rank's lines back whole from MPICH's mpiexec output, where the ranks' pieces interleave.

MPICH's mpiexec writes what it reads from each rank as it comes. A rank that writes a line in two
pieces (Python with ``PYTHONUNBUFFERED=1`` writes the text and its newline apart) can have another
rank's piece land between them: ``rank 1 ... xrank 0 ... x``, then an empty line. No reader of the
merged stream can undo that, so unisonrun asks mpiexec to mark every piece with its rank
(``-prepend-pattern``: Hydra puts the pattern before each piece it reads and after each newline in
it) with a marker that holds a token of its own launch, which no program writes by chance.
`RankLines` splits the stream back into each rank's pieces and mpiexec's own output (unmarked),
passes each rank's complete lines at once, and holds a line without its newline until the newline
comes or `HOLD_SECONDS` have passed; then it passes what there is (a progress bar's line), and the
rest of that line as it comes. Pure: `unison.launcher.mpi.messages.OutputRelay` feeds it what it
reads, with the time.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence

__all__ = ["HOLD_SECONDS", "RankLines", "RankTags", "rank_tags"]

HOLD_SECONDS = 0.5  # how long a rank's line waits for its newline before it is passed as it is
_HELD_BYTES_MAX = 65536  # a longer line without newline is passed at once, not kept in memory
_OPEN = b"\x1e"  # ASCII record separator: opens the marker
_CLOSE = b"\x1f"  # ASCII unit separator: closes it
_RANK_DIGITS_MAX = 9
# Hydra options that tag or redirect the ranks' output themselves (it refuses a second pattern, and
# would write the marker into the files).
_OWN_OUTPUT_OPTIONS = frozenset({"l", "prepend-rank", "prepend-pattern", "outfile", "errfile", "outfile-pattern",
                                 "errfile-pattern"})


@dataclasses.dataclass(frozen=True)
class RankTags:
    """The marker of one launch: ``\\x1e`` TOKEN RANK ``\\x1f``, RANK filled in by mpiexec (``%r``)."""

    token: bytes

    @classmethod
    def new(cls) -> RankTags:
        """A marker with a fresh token."""
        return cls(secrets.token_hex(6).encode())

    @property
    def start(self) -> bytes:
        """The bytes every marker of this launch begins with."""
        return _OPEN + self.token

    @property
    def pattern(self) -> str:
        """mpiexec's ``-prepend-pattern`` argument."""
        return (self.start + b"%r" + _CLOSE).decode()

    def marker(self, rank: int) -> bytes:
        """The marker mpiexec writes before a piece of `rank`'s output.

        Example:
            >>> RankTags(b"ab").marker(3)
            b'\\x1eab3\\x1f'
        """
        return self.start + str(rank).encode() + _CLOSE


def rank_tags(vendor: str, output_dir: str, extra: Sequence[str]) -> RankTags | None:
    """The marker for a launch whose output unisonrun relays, or None where it cannot be used.

    Only MPICH's mpiexec (Hydra) marks pieces; not when it writes the ranks' output to files
    (`output_dir`, ``-outfile-pattern``), nor when the launch's own arguments (`extra`, ``--mpi-args``)
    ask it to tag the output (``-l``, ``-prepend-rank``, ``-prepend-pattern``): Hydra refuses a second one.

    Example:
        >>> rank_tags("mpich", "", ["-l"]) is None, rank_tags("openmpi", "", []) is None
        (True, True)
    """
    if vendor != "mpich" or output_dir:
        return None
    if any(arg.startswith("-") and arg.lstrip("-").split("=", 1)[0] in _OWN_OUTPUT_OPTIONS for arg in extra):
        return None
    return RankTags.new()


def _tail_opening(data: bytes, start: bytes) -> int:
    """The length of the longest end of `data` that may begin a marker cut by a read (`data` holds none whole)."""
    for length in range(min(len(data), len(start) - 1), 0, -1):
        if start.startswith(data[-length:]):
            return length
    return 0


class RankLines:
    """Split mpiexec's marked output into the ranks' whole lines and mpiexec's own output.

    `feed` and `due` return ``(rank, bytes)`` pieces in the order to write them; rank None is
    mpiexec's own output (unmarked: its messages, Hydra's, and anything once markers are missing).

    Example:
        >>> tags = RankTags(b"t")
        >>> lines = RankLines(tags)
        >>> lines.feed(tags.marker(1) + b"rank 1 text" + tags.marker(0) + b"rank 0 text", now=0.0)
        []
        >>> lines.feed(tags.marker(1) + b"\\n" + tags.marker(0) + b"\\n", now=0.01)
        [('1', b'rank 1 text\\n'), ('0', b'rank 0 text\\n')]
        >>> lines.feed(tags.marker(0) + b"10%\\r", now=0.02), lines.due(now=0.2)
        ([], [('0', b'10%\\r')])
    """

    def __init__(self, tags: RankTags, hold_seconds: float = HOLD_SECONDS) -> None:
        self._start = tags.start
        self._hold_seconds = hold_seconds
        self._pending = b""  # the end of the last read, which may be a marker cut in two
        self._rank: str | None = None  # whose piece the stream is in (None: mpiexec's own output)
        self._held: dict[str, bytes] = {}  # rank -> its line so far, without its newline
        self._since: dict[str, float] = {}  # rank -> when its held line began
        self._open: set[str] = set()  # ranks whose line was passed in part: the rest passes as it comes
        self._stats = {"joined": 0, "passed_in_part": 0}

    def __repr__(self) -> str:
        return f"<RankLines held={sorted(self._held)} open={sorted(self._open)}>"

    def statistics(self) -> dict[str, int]:
        """Counters: lines held until their newline came (joined), lines passed before it (passed_in_part)."""
        return dict(self._stats)

    def feed(self, data: bytes, now: float) -> list[tuple[str | None, bytes]]:
        """Take the next bytes read at time `now`; returns the pieces to write now."""
        out: list[tuple[str | None, bytes]] = []
        data, self._pending = self._pending + data, b""
        position = 0
        while position < len(data):
            found = data.find(self._start, position)
            if found < 0:
                keep = _tail_opening(data[position:], self._start)
                self._piece(data[position:len(data) - keep], now, out)
                self._pending = data[len(data) - keep:]
                break
            self._piece(data[position:found], now, out)
            after = found + len(self._start)
            close = data.find(_CLOSE, after)
            rank = data[after:close] if close >= 0 else data[after:]
            if close < 0 and (not rank or rank.isdigit()) and len(rank) <= _RANK_DIGITS_MAX:
                self._pending = data[found:]  # a marker cut by the read: decide with the next bytes
                break
            if close < 0 or not rank.isdigit() or len(rank) > _RANK_DIGITS_MAX:  # no marker: a rank's bytes
                self._piece(data[found:after], now, out)
                position = after
                continue
            self._rank = rank.decode()
            position = close + 1
        return out

    def due(self, now: float) -> list[tuple[str | None, bytes]]:
        """The held lines whose newline did not come within the hold, to pass as they are."""
        out: list[tuple[str | None, bytes]] = []
        for rank, since in list(self._since.items()):
            if now - since >= self._hold_seconds:
                out.append((rank, self._release(rank)))
        return out

    def next_due(self) -> float | None:
        """When the first held line is due (the clock of `now`), or None when none is held."""
        return min(self._since.values()) + self._hold_seconds if self._since else None

    def finish(self) -> list[tuple[str | None, bytes]]:
        """The stream ended: everything still held, then what was undecided."""
        out: list[tuple[str | None, bytes]] = [(rank, self._release(rank)) for rank in list(self._since)]
        if self._pending:
            out.append((self._rank, self._pending))
            self._pending = b""
        return out

    def _release(self, rank: str) -> bytes:
        self._stats["passed_in_part"] += 1
        self._since.pop(rank, None)
        self._open.add(rank)
        return self._held.pop(rank, b"")

    def _piece(self, data: bytes, now: float, out: list[tuple[str | None, bytes]]) -> None:
        """`data` continues the current piece: a rank's up to its newline, mpiexec's own after it."""
        while data:
            rank = self._rank
            if rank is None:
                out.append((None, data))
                return
            end = data.find(b"\n")
            text, data = (data, b"") if end < 0 else (data[:end + 1], data[end + 1:])
            if end >= 0:
                self._rank = None  # Hydra marks every piece, and every line in one: unmarked is its own
            if rank in self._open:
                out.append((rank, text))
                if end >= 0:
                    self._open.discard(rank)
                continue
            held = self._held.pop(rank, b"") + text
            if end >= 0:
                if rank in self._since:
                    self._stats["joined"] += 1
                self._since.pop(rank, None)
                out.append((rank, held))
            elif len(held) >= _HELD_BYTES_MAX:
                self._held[rank] = held
                self._since.setdefault(rank, now)
                out.append((rank, self._release(rank)))
            else:
                self._held[rank] = held
                self._since.setdefault(rank, now)
