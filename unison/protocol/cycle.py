"""The per-cycle decisions of the engine, as pure functions over plain data: status rows and their votes.

Every cycle each rank contributes one status row of unsigned 64-bit words, and every rank receives
the whole matrix (one row per rank):

    [flags, payload bytes, hit word 0 .. hit word W-1, invalid word 0 .. invalid word W-1]

``flags`` holds `FLAG_JOINED` (the rank has joined: it votes for every cache slot), `FLAG_NEWS`
(rank 0 has a stall report or the autotuner's next parameters to announce) and `FLAG_BLOCKED` (the
rank's main thread waits in unison and everything the rank submitted has been sent: it cannot submit
more until a wait ends; the stall inspector's deadlock check reads it); ``payload bytes`` is the length of the rank's uncached
request list; the hit words are the cache slots the rank's pending work is waiting in, and the
invalid words the slots it found stale, each a little-endian bit mask over W 64-bit words.

From the matrix alone, identical on every rank, each rank decides the same things: which cached
responses run now (`read_votes`), whether the slow path runs (`needs_slow_path`), and which cached
tensors some ranks are waiting in (`cached_waits`, for the stall inspector).

A steady-state cycle needs none of that per-rank detail, and a matrix grows with the job: N rows on
every rank, N x N words across the job. So a cycle first reduces one *summary* vector of a fixed size
with a bitwise AND (`encode_summary`, `read_summary`), Horovod's bit-vector exchange:

    [~flags, hit word 0 .. W-1, ~invalid word 0 .. W-1, ~real word 0 .. W-1]

An AND of the hit words is the slots every rank voted for; a word sent complemented comes back as
the complement of an OR: the flags any rank raised, the slots any rank found stale, and the slots some
rank that has not joined really waits in. When the summary says some rank has uncached requests
(`FLAG_PAYLOAD`), rank 0 has news, or rank 0 asks for detail (`FLAG_DETAIL`, the stall feed's look
once a second while something waits), the same cycle also gathers the rows; otherwise the summary
decides alone, at a cost per rank that does not depend on the number of ranks.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterable, Sequence

import numpy as np

__all__ = [
    "FLAG_BLOCKED",
    "FLAG_DETAIL",
    "FLAG_JOINED",
    "FLAG_NEWS",
    "FLAG_PAYLOAD",
    "ROW_FLAGS",
    "Summary",
    "Votes",
    "bits",
    "blocked_ranks",
    "cached_waits",
    "encode_status_row",
    "encode_summary",
    "needs_slow_path",
    "read_summary",
    "summary_of",
    "read_votes",
    "solo_runs",
    "words_for",
]

FLAG_JOINED = 1
FLAG_NEWS = 2  # rank 0 has something to announce (a stall shutdown, autotune parameters): force the slow path
FLAG_BLOCKED = 4  # the rank's main thread waits in unison with nothing left to send
FLAG_DETAIL = 8  # summary only: rank 0 asks every rank for its status row in this cycle
FLAG_PAYLOAD = 16  # summary only: the rank has requests the cache could not answer
ROW_FLAGS = FLAG_JOINED | FLAG_NEWS | FLAG_BLOCKED  # the flags a status row carries
_HEADER = 2  # flags, payload length
_WORD = (1 << 64) - 1


def bits(mask: int) -> list[int]:
    """Set bit positions of a non-negative int, ascending.

    Example:
        >>> bits(0b10110)
        [1, 2, 4]
    """
    if mask.bit_count() > 16:  # many slots (a model's gradients): unpack the bytes at C speed
        packed = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), dtype=np.uint8)
        return np.flatnonzero(np.unpackbits(packed, bitorder="little")).tolist()  # type: ignore[no-any-return]
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def words_for(num_slots: int) -> int:
    """64-bit words needed for a mask over `num_slots` cache slots."""
    return (num_slots + 63) // 64


def _split_words(mask: int, words: int) -> list[int]:
    """The 64-bit words of a non-negative mask, lowest first (through bytes: C speed for long masks)."""
    return list(struct.unpack(f"<{words}Q", mask.to_bytes(8 * words, "little")))


def _join_words(words: Sequence[int]) -> int:
    if len(words) == 1:
        return int(words[0])
    return int.from_bytes(struct.pack(f"<{len(words)}Q", *words), "little")


def encode_status_row(*, joined: bool, news: bool, payload_bytes: int, hits: int, invalid: int,
                      words: int, blocked: bool = False) -> list[int]:
    """This rank's status row (see the module docstring).

    Example:
        >>> encode_status_row(joined=False, news=False, payload_bytes=80, hits=0b101, invalid=0, words=1)
        [0, 80, 5, 0]
    """
    flags = (FLAG_JOINED if joined else 0) | (FLAG_NEWS if news else 0) | (FLAG_BLOCKED if blocked else 0)
    row = [flags, payload_bytes]
    if words:
        row += _split_words(hits, words) + _split_words(invalid, words)
    return row


@dataclasses.dataclass(frozen=True)
class Votes:
    """What the status matrix says about the cache this cycle.

    Attributes:
        votes: each rank's hit mask (joined ranks vote for every slot).
        joined: the ranks that have joined.
        common: slots every rank voted for and at least one rank that has not joined really waits in.
        invalid: slots some rank found stale (erased after this cycle's execution).
    """

    votes: tuple[int, ...]
    joined: frozenset[int]
    common: int
    invalid: int

    def runnable(self) -> list[int]:
        """The cache slots whose responses run this cycle, ascending (the same on every rank)."""
        return bits(self.common & ~self.invalid)


def read_votes(matrix: Sequence[Sequence[int]], words: int) -> Votes:
    """Decode the gathered matrix's votes (`words` as in `words_for` of the cache's slot count).

    Example:
        >>> v = read_votes([[0, 0, 0b011, 0], [1, 0, 0b111, 0b100]], words=1)
        >>> v.common, v.invalid, sorted(v.joined), v.runnable()
        (3, 4, [1], [0, 1])
    """
    joined = frozenset(r for r, row in enumerate(matrix) if int(row[0]) & FLAG_JOINED)
    if not words:
        return Votes((), joined, 0, 0)
    votes = tuple(_join_words(row[_HEADER : _HEADER + words]) for row in matrix)
    common = votes[0]
    invalid = 0
    real = 0  # joined ranks vote for every slot; a slot also needs one real submitter
    for rank, vote in enumerate(votes):
        common &= vote
        invalid |= _join_words(matrix[rank][_HEADER + words :])
        if rank not in joined:
            real |= vote
    return Votes(votes, joined, common & real, invalid)


def blocked_ranks(matrix: Sequence[Sequence[int]]) -> frozenset[int]:
    """The ranks whose row carries `FLAG_BLOCKED` (for the stall inspector's deadlock check).

    Example:
        >>> sorted(blocked_ranks([[4, 0], [0, 0], [5, 0]]))
        [0, 2]
    """
    return frozenset(r for r, row in enumerate(matrix) if int(row[0]) & FLAG_BLOCKED)


def needs_slow_path(matrix: Sequence[Sequence[int]]) -> bool:
    """True when some rank has uncached requests or rank 0 has news: then the request lists are
    gathered to rank 0 and its responses broadcast.

    Example:
        >>> needs_slow_path([[0, 0], [0, 0]]), needs_slow_path([[0, 0], [0, 48]]), needs_slow_path([[2, 0]])
        (False, True, True)
    """
    return any(int(row[1]) for row in matrix) or any(int(row[0]) & FLAG_NEWS for row in matrix)


def cached_waits(
    votes: Votes,
    occupied: Iterable[int],
    members_of_slot: Callable[[int], Sequence[int]],
) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
    """Cached slots some ranks wait in while other members do not: slot -> (waiting, expected).

    The stall inspector's view of tensors that never reach the coordinator (they are answered from
    the cache). Joined ranks are neither waiting nor expected.

    Args:
        votes: this cycle's votes.
        occupied: the cache slots that hold a response.
        members_of_slot: slot -> the global ranks of its response's process set.
    """
    voted_any = 0
    for rank, vote in enumerate(votes.votes):
        if rank not in votes.joined:
            voted_any |= vote
    present = set(occupied)
    out = {}
    for slot in bits(voted_any & ~votes.common):
        if slot not in present:
            continue
        expected = frozenset(r for r in members_of_slot(slot) if r not in votes.joined)
        waiting = frozenset(r for r in expected if votes.votes[r] >> slot & 1)
        if waiting and waiting != expected:
            out[slot] = (waiting, expected)
    return out


def encode_summary(*, joined: bool, news: bool, blocked: bool, detail: bool, payload: bool, hits: int,
                   own: int, invalid: int, words: int) -> list[int]:
    """This rank's summary vector (see the module docstring), to be reduced with a bitwise AND.

    Args:
        hits: the slots this rank votes for: its own pending hits and the slots of process sets it is
            not in (a joined rank votes for every slot).
        own: the slots it waits in itself (its pending hits): a joined rank waits in none.

    Example:
        >>> v = encode_summary(joined=False, news=False, blocked=False, detail=False, payload=True,
        ...                    hits=0b111, own=0b101, invalid=0, words=1)
        >>> [hex(w) for w in v]
        ['0xffffffffffffffef', '0x7', '0xffffffffffffffff', '0xfffffffffffffffa']
    """
    flags = ((FLAG_JOINED if joined else 0) | (FLAG_NEWS if news else 0) | (FLAG_BLOCKED if blocked else 0)
             | (FLAG_DETAIL if detail else 0) | (FLAG_PAYLOAD if payload else 0))
    if not words:
        return [~flags & _WORD]
    width = 64 * words
    full = (1 << width) - 1
    # hits, then the complements of invalid and of own, as one integer split into words once
    packed = (((full & ~(0 if joined else own)) << width | (full & ~invalid)) << width) | (full if joined else hits)
    return [~flags & _WORD, *_split_words(packed, 3 * words)]


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the reduced summary vector says, the same on every rank.

    Attributes:
        flags: the flags some rank raised (OR).
        common: slots every rank voted for and at least one rank that has not joined really waits in.
        invalid: slots some rank found stale (erased after this cycle's execution).
        waiting: slots some rank that has not joined waits in while another rank has not voted for
            them: the cached tensors the stall inspector would look at.
    """

    flags: int
    common: int
    invalid: int
    waiting: int

    @property
    def needs_rows(self) -> bool:
        """Whether this cycle also gathers every rank's status row: the slow path, news or detail."""
        return bool(self.flags & (FLAG_PAYLOAD | FLAG_NEWS | FLAG_DETAIL))

    def runnable(self) -> list[int]:
        """The cache slots whose responses run this cycle, ascending (as `Votes.runnable`)."""
        return bits(self.common & ~self.invalid)


def read_summary(vector: Sequence[int], words: int) -> Summary:
    """Decode the AND-reduced summary vector (`encode_summary`'s layout).

    Example:
        >>> a = encode_summary(joined=False, news=False, blocked=True, detail=False, payload=False,
        ...                    hits=0b011, own=0b011, invalid=0, words=1)
        >>> b = encode_summary(joined=False, news=False, blocked=False, detail=False, payload=False,
        ...                    hits=0b110, own=0b110, invalid=0b100, words=1)
        >>> s = read_summary([x & y for x, y in zip(a, b)], words=1)
        >>> s.flags == FLAG_BLOCKED, s.common, s.invalid, s.waiting, s.needs_rows
        (True, 2, 4, 5, False)
    """
    flags = ~int(vector[0]) & _WORD
    if not words:
        return Summary(flags, 0, 0, 0)
    width = 64 * words
    full = (1 << width) - 1
    packed = _join_words(vector[1 : 1 + 3 * words])
    every = packed & full
    invalid = ~(packed >> width) & full
    real = ~(packed >> (2 * width)) & full
    return Summary(flags, every & real, invalid, real & ~every)


def summary_of(matrix: Sequence[Sequence[int]], words: int) -> Summary:
    """The `Summary` that reducing each rank's `encode_summary` would give, read from the rows instead
    (where the rows were gathered anyway). Rows carry no `FLAG_DETAIL`; a payload is `FLAG_PAYLOAD`.

    Example:
        >>> m = [encode_status_row(joined=False, news=False, payload_bytes=0, hits=0b011, invalid=0, words=1),
        ...      encode_status_row(joined=False, news=False, payload_bytes=9, hits=0b110, invalid=0, words=1)]
        >>> s = summary_of(m, words=1)
        >>> s.flags == FLAG_PAYLOAD, s.common, s.waiting
        (True, 2, 5)
    """
    votes = read_votes(matrix, words)
    flags = 0
    real = 0
    for rank, row in enumerate(matrix):
        flags |= int(row[0]) & ROW_FLAGS
        if int(row[1]):
            flags |= FLAG_PAYLOAD
        if rank not in votes.joined and votes.votes:
            real |= votes.votes[rank]
    every = votes.votes[0] if votes.votes else 0
    for vote in votes.votes[1:]:
        every &= vote
    return Summary(flags, votes.common, votes.invalid, real & ~every)


def solo_runs(summary: Summary, slot: int) -> bool:
    """Whether a cycle with this summary runs the cached response in `slot` and nothing else, gathers no
    rows and erases nothing: then a rank whose only pending work is that slot may run it at once.

    Example:
        >>> solo_runs(Summary(FLAG_BLOCKED, 0b100, 0, 0), 2), solo_runs(Summary(0, 0b110, 0, 0), 2)
        (True, False)
    """
    return not summary.needs_rows and not summary.invalid and summary.common == 1 << slot
