"""The engine's per-cycle decisions on hand-written status matrices: joined ranks, foreign slots, invalid slots."""

from __future__ import annotations

import random

from unison.protocol.cycle import (
    FLAG_BLOCKED,
    FLAG_JOINED,
    FLAG_NEWS,
    FLAG_PAYLOAD,
    bits,
    cached_waits,
    encode_status_row,
    encode_summary,
    needs_slow_path,
    read_summary,
    read_votes,
    solo_runs,
    summary_of,
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


# -- the summary: reduced with an AND, it must say what the matrix of rows says ----------------------

def _and(vectors: list[list[int]]) -> list[int]:
    out = list(vectors[0])
    for vector in vectors[1:]:
        out = [a & b for a, b in zip(out, vector)]
    return out


def _job_state(rng: random.Random, size: int, slots: int) -> list[dict[str, object]]:
    """Random ranks of one job: each slot belongs to a process set; a rank votes for the slots of sets it
    is not in, and waits in some slots of its own sets (all of them once it has joined)."""
    members = {slot: {r for r in range(size) if rng.random() < 0.7} or {rng.randrange(size)}
               for slot in range(slots)}
    states = []
    for rank in range(size):
        foreign = sum(1 << slot for slot in range(slots) if rank not in members[slot])
        own = sum(1 << slot for slot in range(slots) if rank in members[slot] and rng.random() < 0.6)
        states.append({"joined": rng.random() < 0.15, "news": rng.random() < 0.1, "blocked": rng.random() < 0.3,
                       "payload": rng.choice([0, 0, 0, 17]), "own": own, "foreign": foreign,
                       "invalid": rng.getrandbits(slots) if slots and rng.random() < 0.1 else 0})
    return states


def test_the_reduced_summary_agrees_with_the_rows_on_random_jobs() -> None:
    rng = random.Random(7)
    for _ in range(400):
        size, slots = rng.randint(1, 9), rng.choice([0, 1, 5, 64, 65, 130])
        words = words_for(slots)
        states = _job_state(rng, size, slots)
        everything = (1 << slots) - 1
        vectors, rows = [], []
        for s in states:
            hits = everything if s["joined"] else s["own"] | s["foreign"]  # type: ignore[operator]
            vectors.append(encode_summary(joined=s["joined"], news=s["news"], blocked=s["blocked"],  # type: ignore[arg-type]
                                          detail=False, payload=bool(s["payload"]), hits=hits,  # type: ignore[arg-type]
                                          own=s["own"], invalid=s["invalid"], words=words))  # type: ignore[arg-type]
            rows.append(encode_status_row(joined=s["joined"], news=s["news"], payload_bytes=s["payload"],  # type: ignore[arg-type]
                                          hits=hits, invalid=s["invalid"], words=words, blocked=s["blocked"]))  # type: ignore[arg-type]
        summary = read_summary(_and(vectors), words)
        votes = read_votes(rows, words)
        real = 0
        for s in states:
            real |= 0 if s["joined"] else s["own"]  # type: ignore[operator]
        every = _and([[v] for v in votes.votes])[0] if votes.votes else 0
        assert summary.invalid == votes.invalid
        # a slot runs when every rank voted for it and some rank that has not joined waits in it itself
        assert summary.runnable() == bits(every & real & ~votes.invalid)
        if all(not s["joined"] for s in states):  # the rows' rule agrees (it cannot tell own from foreign)
            assert summary.runnable() == votes.runnable()
        assert summary.needs_rows == needs_slow_path(rows)
        assert bool(summary.flags & FLAG_BLOCKED) == any(s["blocked"] for s in states)
        assert bool(summary.flags & FLAG_JOINED) == any(s["joined"] for s in states)
        assert summary.waiting == real & ~every


def test_a_joined_rank_alone_never_makes_a_slot_runnable_in_the_summary() -> None:
    joined = encode_summary(joined=True, news=False, blocked=False, detail=False, payload=False,
                            hits=0b11, own=0, invalid=0, words=1)
    assert read_summary(_and([joined, joined]), 1).runnable() == []
    waiting = encode_summary(joined=False, news=False, blocked=False, detail=False, payload=False,
                             hits=0b10, own=0b10, invalid=0, words=1)
    assert read_summary(_and([joined, waiting]), 1).runnable() == [1]


def test_detail_and_payload_and_news_ask_for_rows_and_solo_runs_needs_the_one_slot_alone() -> None:
    base = {"joined": False, "blocked": False, "hits": 0b100, "own": 0b100, "invalid": 0, "words": 1}
    plain = encode_summary(news=False, detail=False, payload=False, **base)  # type: ignore[arg-type]
    assert not read_summary(plain, 1).needs_rows and solo_runs(read_summary(plain, 1), 2)
    for flag in ("news", "detail", "payload"):
        raised = encode_summary(**{"news": False, "detail": False, "payload": False, flag: True}, **base)  # type: ignore[arg-type]
        summary = read_summary(_and([plain, raised]), 1)
        assert summary.needs_rows and not solo_runs(summary, 2)
    other = encode_summary(news=False, detail=False, payload=False, **{**base, "hits": 0b110, "own": 0b110})  # type: ignore[arg-type]
    assert not solo_runs(read_summary(_and([other, other]), 1), 2)  # slot 1 runs too
    stale = encode_summary(news=False, detail=False, payload=False, **{**base, "invalid": 0b1})  # type: ignore[arg-type]
    assert not solo_runs(read_summary(_and([plain, stale]), 1), 2)  # an erase follows


def test_summary_of_rows_matches_the_reduced_summary() -> None:
    rows = [encode_status_row(joined=False, news=False, payload_bytes=0, hits=0b011, invalid=0, words=1),
            encode_status_row(joined=False, news=True, payload_bytes=5, hits=0b110, invalid=0b1000, words=1,
                              blocked=True)]
    summary = summary_of(rows, 1)
    assert summary.flags == FLAG_NEWS | FLAG_BLOCKED | FLAG_PAYLOAD
    assert (summary.common, summary.invalid, summary.waiting) == (0b010, 0b1000, 0b101)
