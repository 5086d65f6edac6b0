"""The sharding plan: round robin, name hash, slicing of large parameters, row placement."""

from __future__ import annotations

import numpy as np
import pytest

from unison.errors import InvalidArgumentError
from unison.ps.plan import Placement, plan_dense, row_servers, split_rows


def test_small_parameters_are_dealt_round_robin() -> None:
    plan = plan_dense([(f"p{i}", (10,)) for i in range(5)], 2)
    assert [b.server for b in plan.blocks] == [0, 1, 0, 1, 0]
    assert all(b.index == 0 and (b.start, b.stop) == (0, 10) for b in plan.blocks)


def test_large_parameter_is_sliced_on_row_boundaries_across_servers() -> None:
    plan = plan_dense([("w", (1000, 30)), ("b", (30,))], 3)
    blocks = plan.of("w")
    assert [b.server for b in blocks] == [0, 1, 2]
    assert [(b.start, b.stop) for b in blocks] == [(0, 10020), (10020, 20010), (20010, 30000)]
    assert all(b.start % 30 == 0 for b in blocks)
    assert plan.of("b")[0].server == 0  # the deal goes on after the slices
    assert sum(plan.elements_per_server()) == 30030


def test_slices_stay_at_least_the_threshold_and_slicing_can_be_turned_off() -> None:
    # 10,000 elements over 4 servers: two slices of at least 8192 would not fit, so ceil(10000/8192)=2
    assert len(plan_dense([("w", (100, 100))], 4).blocks) == 2
    assert len(plan_dense([("w", (100, 100))], 4, slice_elements=0).blocks) == 1
    assert len(plan_dense([("w", (8192,))], 4).blocks) == 1  # not over the threshold


def test_slicing_balances_one_big_matrix() -> None:
    load = plan_dense([("emb", (4096, 64)), ("fc", (64, 10))], 2).elements_per_server()
    assert max(load) / min(load) < 1.01


def test_name_hash_is_stable_and_independent_of_other_parameters() -> None:
    alone = plan_dense([("fc.weight", (5,))], 4, placement="name_hash")
    among = plan_dense([("a", (3,)), ("fc.weight", (5,)), ("z", (2,))], 4, placement=Placement.NAME_HASH)
    assert alone.of("fc.weight")[0].server == among.of("fc.weight")[0].server


@pytest.mark.parametrize(("params", "kwargs", "match"), [
    ([("w", (2,))], {"num_servers": 0}, r"num_servers must be at least 1. Got num_servers=0"),
    ([("w", (2,)), ("w", (3,))], {"num_servers": 1}, r"Parameter 'w' is declared twice"),
    ([("w#1", (2,))], {"num_servers": 1}, r"without '#'"),
    ([("w", (2,))], {"num_servers": 1, "placement": "random"}, r"placement must be one of"),
])
def test_bad_plans_are_refused(params, kwargs, match) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        plan_dense(params, **kwargs)


def test_rows_spread_evenly_even_with_a_common_stride() -> None:
    servers = row_servers(np.arange(0, 40000, 4, dtype=np.int64), 4)  # every id a multiple of 4
    counts = np.bincount(servers, minlength=4)
    assert counts.min() > 0.9 * 2500 and counts.max() < 1.1 * 2500
    negative = row_servers(np.array([-1, -(2**63), 2**63 - 1]), 3)
    assert ((negative >= 0) & (negative < 3)).all()


def test_split_rows_deduplicates_and_partitions() -> None:
    ids = np.array([[5, 9], [5, -3]])
    unique, inverse, parts = split_rows(ids, 2)
    assert unique.tolist() == [-3, 5, 9]
    assert unique[inverse].tolist() == [5, 9, 5, -3]
    assert sorted(np.concatenate(parts).tolist()) == [0, 1, 2]
    servers = row_servers(unique, 2)
    for server, positions in enumerate(parts):
        assert (servers[positions] == server).all()
