"""The response cache: identical on every rank, it turns steady-state negotiation into one bit-vector exchange.

After a collective has been negotiated once, every rank stores its response in the same slot. When a
rank later submits a request with the same name and attributes, it only votes for that slot's bit; a
slot whose bit every member voted for runs without asking the coordinator. Every mutation (put, erase,
eviction) happens in the same order on every rank, driven by data all ranks share, so the caches never
need to be compared.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict

from .messages import Request, Response

__all__ = ["CacheState", "CacheStatistics", "ResponseCache", "request_key", "response_key"]


class CacheState(enum.Enum):
    """How a request relates to the cache."""

    HIT = "hit"
    MISS = "miss"
    INVALID = "invalid"  # same name cached with other attributes: the slot must be erased everywhere


def request_key(request: Request) -> tuple[object, ...]:
    """The attributes that must match a cached response for `request` to hit it."""
    return (request.kind.value, request.dtype, request.shape, request.reduce_op, request.root_rank,
            request.prescale, request.postscale, request.process_set_id, request.device, request.group)


def response_key(response: Response) -> tuple[object, ...]:
    """The same attributes, read from a single-tensor response."""
    return (response.kind, response.dtype, response.shapes[0], response.reduce_op, response.root_rank,
            response.prescale, response.postscale, response.process_set_id, response.device,
            response.group)


@dataclasses.dataclass(frozen=True)
class CacheStatistics:
    """Counters of a `ResponseCache`: lookups by outcome, insertions, evictions, erased slots, entries."""

    hits: int
    misses: int
    invalid: int
    puts: int
    evictions: int
    erased: int
    entries: int


class ResponseCache:
    """A bounded, least-recently-used map from tensor name to (slot, response).

    Slots are small integers reused lowest-first, so bit vectors stay short and every rank assigns the
    same slot to the same name.

    Example:
        >>> from unison.ops import CollectiveKind
        >>> from unison.dtypes import DType
        >>> cache = ResponseCache(capacity=4)
        >>> resp = Response("allreduce", ("g",), DType.FLOAT32, ((3,),))
        >>> cache.put(resp)
        0
        >>> req = Request("g", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (3,))
        >>> cache.lookup(req)
        (<CacheState.HIT: 'hit'>, 0)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_name: dict[str, int] = {}
        # slot -> (response, its key, the request that last hit it: a recurring call's is matched by identity)
        self._slots: dict[int, tuple[Response, tuple[object, ...], Request | None]] = {}
        self._recency: OrderedDict[int, None] = OrderedDict()
        self._free: list[int] = []
        self._next_slot = 0
        self.version = 0  # bumped on every change, so derived masks can be recomputed lazily
        self._stats = {"hits": 0, "misses": 0, "invalid": 0, "puts": 0, "evictions": 0, "erased": 0}

    def __repr__(self) -> str:
        return f"<ResponseCache {len(self._slots)}/{self.capacity} slots>"

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def num_slots(self) -> int:
        """One past the highest slot number in use or freed (the bit-vector length)."""
        return self._next_slot

    def statistics(self) -> CacheStatistics:
        """Counters: hits, misses, invalid lookups, puts, evictions, erased slots, entries."""
        return CacheStatistics(**self._stats, entries=len(self._slots))

    def lookup(self, request: Request, count: bool = True) -> tuple[CacheState, int]:
        """Classify `request` as a hit (with its slot), a miss, or invalid (with the stale slot);
        `count` False leaves the counters as they were (a look before the lookup that counts)."""
        slot = self._by_name.get(request.name)
        if slot is None:
            if count:
                self._stats["misses"] += 1
            return CacheState.MISS, -1
        if self._slots[slot][1] != request_key(request):
            if count:
                self._stats["invalid"] += 1
            return CacheState.INVALID, slot
        if count:
            self._stats["hits"] += 1
        return CacheState.HIT, slot

    def hit_slot(self, request: Request) -> int:
        """The slot `request` hits, or -1 (a miss or a stale slot); counts nothing (`count_hit`)."""
        slot = self._by_name.get(request.name)
        if slot is None:
            return -1
        stored = self._slots[slot]
        if stored[2] is request:  # the very request that hit it last: a recurring call's
            return slot
        if stored[1] != request_key(request):
            return -1
        self._slots[slot] = (stored[0], stored[1], request)
        return slot

    def count_hit(self) -> None:
        """Count a hit found by a `lookup` that did not count (``count=False``)."""
        self._stats["hits"] += 1

    def slot_of(self, name: str) -> int:
        """The slot holding `name`, or -1."""
        return self._by_name.get(name, -1)

    def get(self, slot: int) -> Response:
        """The response in `slot`, marking it as recently used."""
        self._recency.move_to_end(slot)
        return self._slots[slot][0]

    def peek(self, slot: int) -> Response:
        """The response in `slot`, without touching recency."""
        return self._slots[slot][0]

    def slots(self) -> list[int]:
        """Occupied slots."""
        return list(self._slots)

    def put(self, response: Response) -> int:
        """Store a single-tensor response (refreshing an existing entry); return its slot."""
        name = response.names[0]
        key = response_key(response)
        self.version += 1
        self._stats["puts"] += 1
        slot = self._by_name.get(name)
        if slot is not None:
            self._slots[slot] = (response, key, None)
            self._recency.move_to_end(slot)
            return slot
        if len(self._slots) >= self.capacity:
            victim = next(iter(self._recency))
            self._stats["evictions"] += 1
            self._remove(victim)
        if self._free:
            self._free.sort()
            slot = self._free.pop(0)
        else:
            slot = self._next_slot
            self._next_slot += 1
        self._by_name[name] = slot
        self._slots[slot] = (response, key, None)
        self._recency[slot] = None
        return slot

    def erase(self, slots: list[int]) -> None:
        """Remove the given slots (those no longer present are ignored)."""
        for slot in slots:
            if slot in self._slots:
                self._stats["erased"] += 1
                self._remove(slot)
        self.version += 1

    def _remove(self, slot: int) -> None:
        response, _, _ = self._slots.pop(slot)
        del self._by_name[response.names[0]]
        del self._recency[slot]
        self._free.append(slot)
        self.version += 1
