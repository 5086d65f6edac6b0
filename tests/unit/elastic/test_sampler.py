"""ElasticSampler: Horovod 0.28's; across random sequences of resets and sizes within an epoch, every index is recorded once."""

from __future__ import annotations

import random
from typing import Any

import pytest

from unison.adapters.torch import elastic as _torch

pytest.importorskip("torch")


def samplers(monkeypatch: pytest.MonkeyPatch, n: int, size: int, state: dict[str, Any] | None,
             shuffle: bool) -> list[_torch.ElasticSampler]:
    made = []
    for rank in range(size):
        monkeypatch.setattr(_torch, "_rank", lambda r=rank: r)
        monkeypatch.setattr(_torch, "_size", lambda s=size: s)
        sampler = _torch.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
        if state is not None:
            sampler.load_state_dict(state)
        made.append(sampler)
    return made


def real_indices(sampler: _torch.ElasticSampler, batch: int, batch_size: int) -> list[int]:
    """This rank's batch without the padding (positions past the remaining indices in the dealt order)."""
    start = batch * batch_size
    return [sampler.indices[k] for k in range(start, min(start + batch_size, len(sampler.indices)))
            if k * sampler.num_replicas + sampler.rank < len(sampler.remaining_indices)]


@pytest.mark.parametrize("seed", range(40))
def test_exactly_once_over_random_resets(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    n, batch_size = rng.randint(1, 60), rng.randint(1, 4)
    shuffle = rng.random() < 0.7
    committed: dict[str, Any] | None = None
    history: list[int] = []  # indices of committed steps
    for _ in range(50):
        size = rng.randint(1, 5)
        group = samplers(monkeypatch, n, size, committed, shuffle)
        lengths = {len(list(iter(s))) for s in group}
        assert len(lengths) == 1  # every rank takes the same number of batches
        steps = -(-lengths.pop() // batch_size)
        pending: list[int] = []
        stop_after = rng.randint(0, steps)  # a reset (failure or host change) after this many steps
        for batch in range(stop_after):
            step = [i for s in group for i in real_indices(s, batch, batch_size)]
            assert not set(step) & set(history) and len(set(step)) == len(step)
            for s in group:
                s.record_batch(batch, batch_size)
            pending += step
            if rng.random() < 0.6:  # commit: this step and the ones before it are kept
                history += pending
                pending = []
                assert group[0].processed_indices == set(history)
                committed = group[rng.randrange(size)].state_dict()
        if stop_after == steps and not pending:
            break
    else:
        pytest.skip("the random sequence never finished the epoch")
    assert sorted(history) == list(range(n))


def test_set_epoch_and_state_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    (s,) = samplers(monkeypatch, 10, 1, None, True)
    first = list(iter(s))
    s.record_batch(0, 3)
    assert s.processed_indices == set(first[:3]) and s.processed_num == 3 and len(s) == 10
    state = s.state_dict()
    (t,) = samplers(monkeypatch, 10, 1, state, True)
    assert len(t) == 7 and set(iter(t)) == set(range(10)) - set(first[:3])
    t.set_epoch(1)
    assert t.processed_indices == set() and len(t) == 10 and list(iter(t)) != first
    assert "ElasticSampler(epoch=1" in repr(t)


def horovods_indices(n: int, seed: int, epoch: int, processed_num: int, rank: int, size: int) -> list[int]:
    """What Horovod 0.28's ElasticSampler hands `rank` of `size` (its algorithm, written out here)."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    remaining = order[processed_num:]
    total = -(-len(remaining) // size) * size
    padded = remaining + remaining[:total - len(remaining)]
    return padded[rank:total:size]


def test_a_state_saved_by_horovod_loads_and_deals_the_same_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = {"epoch": 3, "processed_num": 12}  # Horovod 0.28's state_dict()
    group = samplers(monkeypatch, 50, 4, saved, shuffle=True)
    for rank, sampler in enumerate(group):
        assert list(iter(sampler)) == horovods_indices(50, 3, 3, 12, rank, 4)
        assert sampler.processed_num == 12 and sampler.state_dict() == saved and len(sampler) == 10
    (unshuffled,) = samplers(monkeypatch, 7, 1, {"epoch": 0, "processed_num": 2}, shuffle=False)
    assert list(iter(unshuffled)) == [2, 3, 4, 5, 6]


def test_record_batch_counts_every_ranks_batch_whatever_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    (first,) = samplers(monkeypatch, 20, 2, None, shuffle=True)[:1]
    first.record_batch(0, 3)
    first.record_batch(1, 3)
    assert first.processed_num == 12 and first.state_dict() == {"epoch": 0, "processed_num": 12}
    # After a reset to 3 ranks only 8 indices are left: a script whose batch index goes on across the
    # reset (batch 2 of the epoch) still has that batch counted, though the index is past what was dealt.
    after = samplers(monkeypatch, 20, 3, first.state_dict(), shuffle=True)
    assert len(after[0].remaining_indices) == 8
    for sampler in after:
        sampler.record_batch(2, 2)
    assert {s.processed_num for s in after} == {18}
    assert after[0].processed_indices == set(after[0].remaining_indices[:6]) | first.processed_indices
    after[0].set_epoch(1)
    assert after[0].processed_num == 0 and after[0].processed_indices == set()


def test_a_state_without_processed_num_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    (sampler,) = samplers(monkeypatch, 4, 1, None, shuffle=False)
    with pytest.raises(ValueError, match=r"ElasticSampler.load_state_dict needs \{'epoch': E, 'processed_num': N\} "
                       r"\(what state_dict\(\) returns, as in Horovod 0.28\). Got \['epoch', 'processed_indices'\]."):
        sampler.load_state_dict({"epoch": 0, "processed_indices": {1}})
