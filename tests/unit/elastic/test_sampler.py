"""ElasticSampler: across random sequences of resets and sizes within an epoch, every index is recorded once."""

from __future__ import annotations

import random
from typing import Any

import pytest

from unison.elastic import _torch

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
    assert s.processed_indices == set(first[:3]) and len(s) == 10
    state = s.state_dict()
    (t,) = samplers(monkeypatch, 10, 1, state, True)
    assert len(t) == 7 and set(iter(t)) == set(range(10)) - set(first[:3])
    t.set_epoch(1)
    assert t.processed_indices == set() and len(t) == 10 and list(iter(t)) != first
    assert "ElasticSampler(epoch=1" in repr(t)
