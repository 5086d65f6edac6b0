"""The lockstep plugin's barrier over torch's store (suites run by torchrun): names met, ranks missing named."""

from __future__ import annotations

import threading

import pytest

dist = pytest.importorskip("torch.distributed")

from unison.testing._barrier import BarrierTimeout, StoreBarrier, describe_mismatch  # noqa: E402


def _ranks(size: int) -> list[StoreBarrier]:
    store = dist.HashStore()
    made: dict[int, StoreBarrier] = {}
    threads = [threading.Thread(target=lambda r=r: made.__setitem__(r, StoreBarrier(store, r, size))) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return [made[r] for r in range(size)]


def _wait_all(barriers: list[StoreBarrier], names: list[str], timeout: float = 5.0) -> list[object]:
    results: list[object] = [None] * len(barriers)

    def run(r: int) -> None:
        try:
            results[r] = barriers[r].wait(names[r], timeout)
        except BarrierTimeout as exc:
            results[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(barriers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return results


def test_every_rank_sees_the_point_each_rank_reached() -> None:
    barriers = _ranks(3)
    assert [b.identities for b in barriers][0] == barriers[2].identities
    first = _wait_all(barriers, ["start of a"] * 3)
    assert first == [{0: "start of a", 1: "start of a", 2: "start of a"}] * 3
    second = _wait_all(barriers, ["start of b", "start of c", "start of b"])
    assert describe_mismatch(second[0]) == describe_mismatch(second[1]) is not None  # type: ignore[arg-type]
    assert "rank 1 is at 'start of c'" in str(describe_mismatch(second[2]))  # type: ignore[arg-type]


def test_a_rank_that_never_arrives_is_named() -> None:
    barriers = _ranks(3)
    results = _wait_all(barriers[:2], ["start of a", "start of a"], timeout=0.5)
    for result in results:
        assert isinstance(result, BarrierTimeout)
        assert result.missing_ranks == [2]
        assert "ranks [2] did not reach the barrier for start of a within 0.5 s" in str(result)
