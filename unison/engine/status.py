"""One cycle's status exchange: a fixed-size summary every rank reduces, and the rows only when needed.

Every cycle every rank reduces one summary vector with a bitwise AND (`unison.protocol.cycle`): the
cache slots every rank voted for, the flags and stale slots any rank raised, the slots some rank waits
in. In steady-state training that is the whole exchange, and its size does not depend on the number of
ranks. The per-rank rows (payload lengths, each rank's votes and flags) are gathered to rank 0 in the
same cycle only when the summary asks for them: some rank has requests the cache could not answer
(rank 0's gather of the requests needs their lengths), rank 0 has news, or rank 0's stall feed asked
for detail; only rank 0 reads them, so only rank 0's cost grows with the job (a transport that gathers
to every rank anyway hands every rank the rows). A backend whose every exchange is one round trip to
one server (``reduces_status`` False: the gRPC control plane) gathers the rows to every rank every
cycle instead, and the summary is read from them.

A detail cycle (rank 0's stall feed asked for detail: `FLAG_DETAIL` in the reduced summary, or in rank
0's row where rows go to every rank each cycle) also gathers one more fixed-size row from every rank:
where its main thread is (`unison.protocol.places`, made by `where_of`), kept for the feed in `places`.
Only those cycles read or send it, so the steady state never does.

The steady state's own cycle (`reduce_solo`): a rank whose only work is one cached allreduce sends the
vector of that slot alone, made once per slot and kept; when the reduced vector comes back as every
rank sending the same (flags aside from "blocked"), the summary is known without decoding it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backends.base import Backend
from ..protocol.cycle import (
    FLAG_BLOCKED,
    FLAG_DETAIL,
    Summary,
    encode_status_row,
    encode_summary,
    read_summary,
    summary_of,
)
from ..protocol.places import ROW_BYTES

__all__ = ["StatusExchange"]

_KEPT_VECTORS = 4096  # solo vectors kept (slot, foreign slots, blocked, words); the table is dropped past it


class StatusExchange:
    """This rank's side of every cycle's status exchange over one backend.

    Args:
        backend: the control plane.

    Attributes:
        reduces: the summary is reduced (False: rows are gathered every cycle).
        summaries: cycles that reduced a summary.
        rows_gathered: cycles that also gathered every rank's row.
        places_gathered: detail cycles that also gathered every rank's place.
        where_of: makes this rank's place row (`unison.protocol.places.encode_place`); None sends an empty one.
        places: every rank's place row from the latest detail cycle, where they reached this rank (rank 0),
            until `take_places`.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.reduces = bool(getattr(backend, "reduces_status", True))
        self.summaries = 0
        self.rows_gathered = 0
        self.places_gathered = 0
        self.where_of: Callable[[], bytes] | None = None
        self.places: list[bytes] | None = None
        self._detail = False  # this cycle is a detail cycle: its rows come with every rank's place
        # (slot, foreign slots, blocked, words) -> (the vector, the reduced bytes of every rank sending
        # the same, with and without "blocked", and the summary each of those means)
        self._solo: dict[tuple[int, int, bool, int], tuple[np.ndarray, dict[bytes, Summary]]] = {}

    def __repr__(self) -> str:
        mode = "summary first" if self.reduces else "rows every cycle"
        return f"<StatusExchange {mode} summaries={self.summaries} rows={self.rows_gathered}>"

    def exchange(self, *, joined: bool, news: bool, blocked: bool, detail: bool, payload_bytes: int,
                 hits: int, own: int, invalid: int, words: int) -> tuple[Summary, list[list[int]] | None]:
        """Exchange this rank's status; return the summary and, when they were gathered and reached this
        rank, every rank's rows (rank 0 gets them whenever the summary asked for them).

        Args:
            joined: this rank has joined (it votes for every slot).
            news: rank 0 has a stall report or autotune parameters to announce.
            blocked: this rank's main thread waits in unison with nothing left to send.
            detail: rank 0 asks for every rank's row in this cycle (ignored elsewhere: only rank 0 sets it).
            payload_bytes: the length of this rank's uncached request list.
            hits: the cache slots this rank votes for.
            own: the slots it waits in itself (`encode_summary`).
            invalid: the slots this rank found stale.
            words: 64-bit words per slot mask (`unison.protocol.cycle.words_for`), the same on every rank.
        """
        if self.reduces:
            self.summaries += 1
            vector = encode_summary(joined=joined, news=news, blocked=blocked, detail=detail,
                                    payload=payload_bytes > 0, hits=hits, own=own, invalid=invalid,
                                    words=words)
            summary = read_summary(self._backend.reduce_status(np.array(vector, dtype=np.uint64)).tolist(), words)
            self._detail = bool(summary.flags & FLAG_DETAIL)
            if not summary.needs_rows:
                return summary, None
        matrix = self.rows(joined=joined, news=news, blocked=blocked, payload_bytes=payload_bytes, hits=hits,
                           invalid=invalid, words=words, detail=detail)
        if self.reduces:
            return summary, matrix
        assert matrix is not None  # gathered to every rank
        return summary_of(matrix, words), matrix

    def rows(self, *, joined: bool, news: bool, blocked: bool, payload_bytes: int, hits: int, invalid: int,
             words: int, detail: bool = False) -> list[list[int]] | None:
        """Gather every rank's status row (`encode_status_row`) to rank 0, in the cycle whose summary asked
        for them (to every rank where ``reduces`` is False); None on a rank they did not reach. In a
        detail cycle every rank's place follows (`places`).

        `detail`: rank 0 asks for detail, where rows go to every rank each cycle (``reduces`` False): its
        row then carries `FLAG_DETAIL`, which every rank reads from the gathered rows.
        """
        self.rows_gathered += 1
        fields = encode_status_row(joined=joined, news=news, payload_bytes=payload_bytes, hits=hits,
                                   invalid=invalid, words=words, blocked=blocked)
        if detail and not self.reduces:
            fields[0] |= FLAG_DETAIL
        row = np.array(fields, dtype=np.uint64)
        backend = self._backend
        matrix = backend.gather_status(row) if self.reduces else backend.allgather_status(row)
        if not self.reduces:
            self._detail = matrix is not None and bool(int(matrix[0][0]) & FLAG_DETAIL)
        if self._detail:
            self._gather_places()
        return None if matrix is None else matrix.tolist()

    def take_places(self) -> list[bytes] | None:
        """Every rank's place row from the latest detail cycle (index = rank), once; None if there was none."""
        places, self.places = self.places, None
        return places

    def _gather_places(self) -> None:
        """The detail cycle's second gather: every rank's place row (`unison.protocol.places`) to rank 0."""
        self.places_gathered += 1
        mine = self.where_of() if self.where_of is not None else b""
        row = np.frombuffer(bytearray(mine[:ROW_BYTES].ljust(ROW_BYTES, b"\0")), dtype=np.uint64)
        matrix = self._backend.gather_status(row)
        if matrix is not None and self._backend.rank == 0:
            self.places = [np.ascontiguousarray(line).tobytes() for line in matrix]

    def reduce_solo(self, slot: int, foreign: int, blocked: bool, words: int) -> Summary:
        """Reduce the summary of a rank whose only work is the cached allreduce in `slot` (``reduces``
        must be True); `foreign` are the slots of sets it is not in, which it votes for too."""
        self.summaries += 1
        key = (slot, foreign, blocked, words)
        kept = self._solo.get(key)
        if kept is None:
            kept = self._solo_vector(slot, foreign, blocked, words)
        vector, known = kept
        reduced = self._backend.reduce_status(vector)
        summary = known.get(reduced.tobytes())
        if summary is None:
            summary = read_summary(reduced.tolist(), words)
            self._detail = bool(summary.flags & FLAG_DETAIL)
        return summary

    def _solo_vector(self, slot: int, foreign: int, blocked: bool,
                     words: int) -> tuple[np.ndarray, dict[bytes, Summary]]:
        mine = encode_summary(joined=False, news=False, blocked=blocked, detail=False, payload=False,
                              hits=(1 << slot) | foreign, own=1 << slot, invalid=0, words=words)
        vector = np.array(mine, dtype=np.uint64)
        known: dict[bytes, Summary] = {}
        for flags in (0, FLAG_BLOCKED):  # what comes back when every rank sent the same, some blocked
            same = np.array([~flags & ((1 << 64) - 1), *mine[1:]], dtype=np.uint64)
            known[same.tobytes()] = read_summary(same.tolist(), words)
        if len(self._solo) >= _KEPT_VECTORS:
            self._solo.clear()
        kept = self._solo[(slot, foreign, blocked, words)] = (vector, known)
        return kept
