"""This rank's pending work against the response cache: what it votes for, and what it still has to send.

Each cycle the engine admits what it drained from the queue: an entry whose request the cache knows
(a *hit*) waits in its slot and is voted for; any other is *unsent* until the next status exchange
carries it to the coordinator. A group is all hits or all sent, so it can only ever run whole. After
the cache changes (an erase, an eviction, the autotuner turning it off), `revalidate` sends back
through negotiation the hits whose slot is gone. Only the engine thread calls the methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ops import Kind
from ..protocol.cache import CacheState, ResponseCache
from ..protocol.cycle import words_for
from ..protocol.messages import Request
from .handles import Entry

__all__ = ["PendingWork"]


class PendingWork:
    """The entries this rank drained from the queue and has not executed yet.

    Args:
        rank: this rank.
        cache: this rank's response cache (identical on every rank).
        process_sets: set id -> members, the engine's own dict (it changes as sets are added).

    Attributes:
        entries: name -> entry, for every entry admitted and not taken yet.
        joined: this rank has joined (`Kind.JOIN` admitted, not answered yet): it votes for every slot.
        invalid: bit mask of the slots this rank found stale in this cycle's admissions.
    """

    def __init__(self, rank: int, cache: ResponseCache,
                 process_sets: Mapping[int, tuple[int, ...]]) -> None:
        self.rank = rank
        self.cache = cache
        self._process_sets = process_sets
        self.entries: dict[str, Entry] = {}
        self.joined = False
        self.invalid = 0
        self._unsent: list[Entry] = []  # pending entries the coordinator has not seen yet
        self._votes_version = -1
        self._solo_votes = (0, 0)  # `solo_votes` at `_votes_version`

    def __repr__(self) -> str:
        return f"<PendingWork entries={len(self.entries)} unsent={len(self._unsent)} joined={self.joined}>"

    @property
    def unsent(self) -> bool:
        """Whether some entries wait for the next status exchange to reach the coordinator."""
        return bool(self._unsent)

    def admit(self, groups: Sequence[list[Entry]], cache_on: bool) -> None:
        """Start a cycle's admissions: classify each newly drained group against the cache."""
        self.invalid = 0
        for group in groups:
            self._admit(group, cache_on)

    def _admit(self, group: list[Entry], cache_on: bool) -> None:
        slots: list[int] = []
        any_miss = False
        for entry in group:
            self.entries[entry.request.name] = entry
            if entry.request.kind is Kind.JOIN:
                self.joined = True
            if not cache_on or entry.request.kind is not Kind.ALLREDUCE:
                slots.append(-1)
                any_miss = True
                continue
            state, slot = self.cache.lookup(entry.request)
            if state is CacheState.HIT:
                slots.append(slot)
            else:
                if state is CacheState.INVALID:
                    self.invalid |= 1 << slot
                slots.append(-1)
                any_miss = True
        for entry, slot in zip(group, slots):
            # A group is all cached or all negotiated, so it can only ever run whole.
            entry.slot = -1 if any_miss else slot
            if entry.slot < 0:
                self._unsent.append(entry)

    def take_unsent(self) -> list[Request]:
        """Return the requests to send in this cycle's status exchange, once."""
        unsent, self._unsent = self._unsent, []
        return [entry.request for entry in unsent]

    def hits(self) -> int:
        """The cache slots this rank votes for: its pending hits and the slots of sets it is not in
        (every slot once it has joined)."""
        if self.joined:
            return (1 << self.cache.num_slots) - 1
        hits = 0
        for entry in self.entries.values():
            if entry.slot >= 0:
                hits |= 1 << entry.slot
        return hits | self.foreign()

    def own_hits(self) -> int:
        """The cache slots this rank's pending entries wait in (none once it has joined)."""
        if self.joined:
            return 0
        own = 0
        for entry in self.entries.values():
            if entry.slot >= 0:
                own |= 1 << entry.slot
        return own

    def foreign(self) -> int:
        """Cache slots of process sets this rank is not in (it votes for them, never blocks them)."""
        return self.solo_votes()[0]

    def solo_votes(self) -> tuple[int, int]:
        """`foreign`, and the 64-bit words of the cache's bit-vector: what a solo cycle votes beside its
        own slot, kept until the cache changes (both on every steady call)."""
        cache = self.cache
        if self._votes_version != cache.version:
            mask = 0
            for slot in cache.slots():
                members = self._process_sets.get(cache.peek(slot).process_set_id, ())
                if self.rank not in members:
                    mask |= 1 << slot
            self._solo_votes = (mask, words_for(cache.num_slots))
            self._votes_version = cache.version
        return self._solo_votes

    def revalidate(self) -> None:
        """After the cache changed, send through negotiation any pending hit whose slot is gone."""
        lost: list[Entry] = []
        for entry in self.entries.values():
            if entry.slot >= 0 and self.cache.slot_of(entry.request.name) != entry.slot:
                lost.extend(entry.group or [entry])
        for entry in lost:
            if entry.slot >= 0:
                entry.slot = -1
                self._unsent.append(entry)

    def take(self, name: str) -> Entry | None:
        """Remove and return the entry named `name` (its response runs now); None if this rank has none."""
        return self.entries.pop(name, None)

    def clear(self) -> list[Entry]:
        """Forget every entry (the engine stopped); return them, to fail their handles."""
        entries = list(self.entries.values())
        self.entries.clear()
        self._unsent = []
        return entries
