"""This rank's pending work: hits vote, misses are sent once, groups run whole, lost slots go back."""

from __future__ import annotations

import numpy as np

from unison.dtypes import DType
from unison.engine.handles import Entry, Handle
from unison.engine.pending import PendingWork
from unison.ops import Kind
from unison.protocol.cache import ResponseCache
from unison.protocol.messages import Request, Response


def entry(name: str, kind: Kind = Kind.ALLREDUCE, shape: tuple[int, ...] = (1,), process_set_id: int = 0) -> Entry:
    value = np.zeros(shape, np.float32)
    request = Request(name, kind, 0, DType.FLOAT32, shape, process_set_id=process_set_id)
    return Entry(request, value, value, Handle(name))


def cached(*names: str, process_set_id: int = 0) -> ResponseCache:
    cache = ResponseCache(8)
    for name in names:
        cache.put(Response(Kind.ALLREDUCE, (name,), DType.FLOAT32, ((1,),), process_set_id=process_set_id))
    return cache


def test_hits_vote_and_misses_are_sent_once() -> None:
    cache = cached("allreduce.a")
    work = PendingWork(0, cache, {0: (0, 1)})
    hit, miss = entry("allreduce.a"), entry("allreduce.b")
    work.admit([[hit], [miss]], cache_on=True)
    assert hit.slot == cache.slot_of("allreduce.a") and miss.slot == -1
    assert work.hits() == 1 << hit.slot and work.unsent
    assert [r.name for r in work.take_unsent()] == ["allreduce.b"]
    assert work.take_unsent() == [] and not work.unsent


def test_a_group_with_one_miss_is_sent_whole_and_a_stale_slot_is_marked_invalid() -> None:
    cache = cached("allreduce.a")
    work = PendingWork(0, cache, {0: (0, 1)})
    changed = entry("allreduce.a", shape=(2,))  # same name, other shape: the slot is stale
    work.admit([[changed, entry("allreduce.c")]], cache_on=True)
    assert work.invalid == 1 << cache.slot_of("allreduce.a")
    assert [r.name for r in work.take_unsent()] == ["allreduce.a", "allreduce.c"]
    work.admit([], cache_on=True)
    assert work.invalid == 0  # per cycle


def test_with_the_cache_off_everything_is_sent_and_join_votes_for_every_slot() -> None:
    cache = cached("allreduce.a")
    work = PendingWork(0, cache, {0: (0, 1)})
    work.admit([[entry("allreduce.a")], [entry("join.noname", Kind.JOIN)]], cache_on=False)
    assert len(work.take_unsent()) == 2
    assert work.joined and work.hits() == (1 << cache.num_slots) - 1


def test_slots_of_sets_this_rank_is_not_in_are_always_voted_for() -> None:
    cache = cached("allreduce.other", process_set_id=3)
    work = PendingWork(0, cache, {0: (0, 1), 3: (1,)})
    assert work.hits() == 1 << cache.slot_of("allreduce.other")


def test_revalidate_sends_back_hits_whose_slot_is_gone_and_clear_returns_all() -> None:
    cache = cached("allreduce.a")
    work = PendingWork(0, cache, {0: (0, 1)})
    hit = entry("allreduce.a")
    work.admit([[hit]], cache_on=True)
    cache.erase(cache.slots())
    work.revalidate()
    assert hit.slot == -1 and [r.name for r in work.take_unsent()] == ["allreduce.a"]
    assert work.take("allreduce.missing") is None
    assert work.clear() == [hit] and work.entries == {}
