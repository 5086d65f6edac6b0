"""Response cache bookkeeping and the fusion planner."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from unison.dtypes import DType
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.cache import CacheState, ResponseCache
from unison.protocol.fusion import FusionPolicy, plan_fusion
from unison.protocol.messages import Request, Response


def resp(name: str, shape=(4,), dtype=DType.FLOAT32, **kw) -> Response:
    return Response("allreduce", (name,), dtype, (shape,), **kw)


def req(name: str, shape=(4,), dtype=DType.FLOAT32, **kw) -> Request:
    return Request(name, CollectiveKind.ALLREDUCE, 0, dtype, shape, **kw)


def test_hit_miss_invalid() -> None:
    cache = ResponseCache(8)
    assert cache.lookup(req("a")) == (CacheState.MISS, -1)
    slot = cache.put(resp("a"))
    assert cache.lookup(req("a")) == (CacheState.HIT, slot)
    assert cache.lookup(req("a", shape=(5,))) == (CacheState.INVALID, slot)
    assert cache.lookup(req("a", reduce_op=ReduceOp.MAX)) == (CacheState.INVALID, slot)
    assert cache.statistics().hits == 1 and cache.statistics().invalid == 2


def test_lru_eviction_and_lowest_free_slot_reuse() -> None:
    cache = ResponseCache(2)
    assert cache.put(resp("a")) == 0
    assert cache.put(resp("b")) == 1
    cache.get(0)  # a is now more recent than b
    assert cache.put(resp("c")) == 1  # evicts b, reuses its slot
    assert cache.slot_of("b") == -1 and cache.slot_of("a") == 0
    cache.erase([0])
    assert cache.put(resp("d")) == 0
    assert cache.num_slots == 2 and len(cache) == 2


def test_same_operations_give_same_slots_on_every_rank() -> None:
    ops = [("put", "a"), ("put", "b"), ("get", "a"), ("put", "c"), ("erase", "a"), ("put", "d")]
    caches = [ResponseCache(2) for _ in range(3)]
    for cache in caches:
        for op, name in ops:
            if op == "put":
                cache.put(resp(name))
            elif op == "get":
                cache.get(cache.slot_of(name))
            else:
                cache.erase([cache.slot_of(name)])
    layouts = [{s: c.peek(s).names for s in c.slots()} for c in caches]
    assert layouts[0] == layouts[1] == layouts[2]


def test_fusion_merges_compatible_small_allreduces_only() -> None:
    a, b = resp("a"), resp("b")
    other_dtype = resp("c", dtype=DType.FLOAT64)
    other_op = resp("d", reduce_op=ReduceOp.MAX)
    bcast = Response("broadcast", ("e",), DType.FLOAT32, ((4,),), root_rank=0)
    plan = plan_fusion([a, other_dtype, b, bcast, other_op], FusionPolicy())
    assert [r.names for r in plan] == [("a", "b"), ("c",), ("e",), ("d",)]
    assert plan[0].shapes == ((4,), (4,))


def test_fusion_threshold_and_large_tensors() -> None:
    small = [resp(f"s{i}", shape=(16,)) for i in range(4)]  # 64 bytes each
    plan = plan_fusion(small, FusionPolicy(threshold_bytes=128))
    assert [r.names for r in plan] == [("s0", "s1"), ("s2", "s3")]
    assert plan_fusion(small, FusionPolicy(threshold_bytes=0)) == small
    big = resp("big", shape=(1 << 20,))  # 4 MiB > max_tensor_bytes
    plan = plan_fusion([small[0], big, small[1]], FusionPolicy())
    assert [r.names for r in plan] == [("s0", "s1"), ("big",)]


def test_group_only_fusion() -> None:
    g1 = [dataclasses.replace(resp(f"g_{i}of2"), group="g") for i in (1, 2)]
    loose = resp("x")
    plan = plan_fusion([g1[0], loose, g1[1]], FusionPolicy(group_only=True))
    assert [r.names for r in plan] == [("g_1of2", "g_2of2"), ("x",)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allreduce", "broadcast"]),
                          st.sampled_from([DType.FLOAT32, DType.INT32, DType.FLOAT16]),
                          st.integers(0, 3000)), max_size=30),
       st.integers(0, 8192))
def test_fusion_plan_invariants(items, threshold) -> None:
    responses = [Response(kind, (f"t{i}",), dtype, ((n,),)) for i, (kind, dtype, n) in enumerate(items)]
    policy = FusionPolicy(threshold_bytes=threshold, max_tensor_bytes=4096)
    plan = plan_fusion(responses, policy)
    names = [n for r in plan for n in r.names]
    assert sorted(names) == sorted(r.names[0] for r in responses)  # each exactly once
    for r in plan:
        if len(r.names) > 1:
            assert r.kind == "allreduce" and r.num_bytes() <= threshold
            members = [x for x in responses if x.names[0] in r.names]
            assert len({(m.dtype, m.reduce_op) for m in members}) == 1
    assert plan_fusion(responses, policy) == plan  # deterministic
