"""The engine's per-cycle decisions on hand-written status matrices: joined ranks, foreign slots, invalid slots."""

from __future__ import annotations

from unison.protocol.cycle import (
    FLAG_JOINED,
    FLAG_NEWS,
    bits,
    cached_waits,
    encode_status_row,
    needs_slow_path,
    read_votes,
    words_for,
)


def row(flags: int = 0, payload: int = 0, hits: int = 0, invalid: int = 0, words: int = 1) -> list[int]:
    return encode_status_row(joined=bool(flags & FLAG_JOINED), news=bool(flags & FLAG_NEWS),
                             payload_bytes=payload, hits=hits, invalid=invalid, words=words)


def test_words_and_bits() -> None:
    assert [words_for(n) for n in (0, 1, 64, 65, 1024)] == [0, 1, 1, 2, 16]
    assert bits(0) == [] and bits(1 << 70 | 1) == [0, 70]


def test_row_layout_and_masks_over_several_words() -> None:
    high = 1 << 100 | 1 << 3
    r = encode_status_row(joined=True, news=True, payload_bytes=7, hits=high, invalid=1 << 64, words=2)
    assert r == [FLAG_JOINED | FLAG_NEWS, 7, 1 << 3, 1 << 36, 0, 1]
    votes = read_votes([r, r], words=2)
    assert votes.votes == (high, high) and votes.invalid == 1 << 64


def test_a_slot_runs_only_when_every_rank_voted_for_it() -> None:
    votes = read_votes([row(hits=0b0111), row(hits=0b1101), row(hits=0b0101)], words=1)
    assert votes.common == 0b0101 and votes.runnable() == [0, 2]


def test_joined_ranks_vote_for_everything_but_a_slot_needs_one_real_waiter() -> None:
    everything = (1 << 64) - 1
    votes = read_votes([row(FLAG_JOINED, hits=everything), row(hits=0b10)], words=1)
    assert votes.joined == frozenset({0}) and votes.runnable() == [1]
    # every rank joined: nothing runs from the cache
    assert read_votes([row(FLAG_JOINED, hits=everything)] * 2, words=1).runnable() == []


def test_foreign_slots_are_voted_by_non_members_without_making_them_run() -> None:
    # Slot 3 belongs to a set of ranks {0, 1}: rank 2 votes for it as foreign; it runs once 0 and 1 wait.
    assert read_votes([row(hits=0b1000), row(hits=0), row(hits=0b1000)], words=1).runnable() == []
    assert read_votes([row(hits=0b1000), row(hits=0b1000), row(hits=0b1000)], words=1).runnable() == [3]


def test_an_invalid_slot_does_not_run_and_is_reported_for_erasure() -> None:
    votes = read_votes([row(hits=0b11, invalid=0b10), row(hits=0b11)], words=1)
    assert votes.common == 0b11 and votes.invalid == 0b10 and votes.runnable() == [0]


def test_slow_path_when_some_rank_has_uncached_requests_or_rank_0_has_news() -> None:
    assert not needs_slow_path([row(hits=1), row(hits=1)])
    assert needs_slow_path([row(), row(payload=40)])
    assert needs_slow_path([row(FLAG_NEWS), row()])


def test_no_cache_means_no_vote_words() -> None:
    votes = read_votes([row(words=0), row(FLAG_JOINED, words=0)], words=0)
    assert votes.votes == () and votes.joined == frozenset({1}) and votes.runnable() == []


def test_cached_waits_names_the_ranks_waiting_in_a_slot_the_others_have_not_reached() -> None:
    votes = read_votes([row(hits=0b01), row(hits=0b11), row(hits=0b00)], words=1)
    members = {0: (0, 1, 2), 1: (0, 1)}
    waits = cached_waits(votes, occupied=[0, 1], members_of_slot=members.__getitem__)
    assert waits == {0: (frozenset({0, 1}), frozenset({0, 1, 2})), 1: (frozenset({1}), frozenset({0, 1}))}
    # an empty slot (stale vote) and a slot every member waits in are not stalls
    assert cached_waits(votes, occupied=[], members_of_slot=members.__getitem__) == {}


def test_cached_waits_leaves_joined_ranks_out() -> None:
    everything = (1 << 64) - 1
    votes = read_votes([row(hits=0b1), row(FLAG_JOINED, hits=everything), row(hits=0)], words=1)
    waits = cached_waits(votes, occupied=[0], members_of_slot=lambda slot: (0, 1, 2))
    assert waits == {0: (frozenset({0}), frozenset({0, 2}))}
