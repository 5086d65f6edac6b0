"""The rank-0 Coordinator: readiness, ordering, agreement checks, join, groups and process sets."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unison.dtypes import DType
from unison.ops import CollectiveKind, ReduceOp
from unison.protocol.messages import Request, ResponseKind
from unison.protocol.negotiation import Coordinator, reducescatter_rows

AR = CollectiveKind.ALLREDUCE


def req(name: str, rank: int, kind: CollectiveKind = AR, **kw: object) -> Request:
    kw.setdefault("dtype", DType.FLOAT32)
    kw.setdefault("shape", (4,))
    return Request(name, kind, rank, **kw)  # type: ignore[arg-type]


def one_cycle(coordinator: Coordinator, *per_rank: list[Request]):
    return coordinator.handle(list(per_rank), now=0.0)


def test_ready_only_when_every_rank_submitted() -> None:
    c = Coordinator(3)
    assert one_cycle(c, [req("a", 0)], [req("a", 1)], []) == []
    assert c.pending()["a"][0] == frozenset({0, 1})
    out = one_cycle(c, [], [], [req("a", 2)])
    assert [r.names for r in out] == [("a",)]
    assert c.pending() == {}


def test_order_is_the_order_tensors_became_ready() -> None:
    c = Coordinator(2)
    out = one_cycle(c, [req("a", 0), req("b", 0)], [req("b", 1), req("a", 1)])
    # rank 1's list completes b first, then a.
    assert [r.names[0] for r in out] == ["b", "a"]


def test_response_carries_attributes() -> None:
    c = Coordinator(2)
    kw = dict(reduce_op=ReduceOp.MAX, prescale=0.5, postscale=2.0, shape=(2, 3))
    out = one_cycle(c, [req("a", 0, **kw)], [req("a", 1, **kw)])
    r = out[0]
    assert (r.kind, r.dtype, r.shapes, r.reduce_op, r.prescale, r.postscale) == (
        "allreduce", DType.FLOAT32, ((2, 3),), ReduceOp.MAX, 0.5, 2.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(shape=(5,)), r"Mismatched ALLREDUCE tensor shapes for 'x': \[4\] on ranks \[0, 1\]; \[5\] on rank \[2\]\."),
        (dict(dtype=DType.INT32), r"Mismatched data types for allreduce 'x': float32 on ranks \[0, 1\]; int32 on rank \[2\]\."),
        (dict(kind=CollectiveKind.ALLGATHER), r"Mismatched operations for 'x': ALLREDUCE on ranks \[0, 1\]; ALLGATHER on rank \[2\]\."),
        (dict(reduce_op=ReduceOp.MAX), r"Mismatched reduction operation for allreduce 'x': SUM on ranks \[0, 1\]; MAX on rank \[2\]\."),
        (dict(prescale=0.5), r"Mismatched prescale and/or postscale factors for allreduce 'x': \(1, 1\) on ranks \[0, 1\]; \(0\.5, 1\) on rank \[2\]\."),
        (dict(device="cuda"), r"Mismatched ALLREDUCE CPU/GPU device selection for 'x': CPU on ranks \[0, 1\]; GPU on rank \[2\]\."),
    ],
)
def test_mismatch_names_tensor_attribute_and_ranks_grouped_by_value(change: dict, message: str) -> None:
    c = Coordinator(3)
    good = [req("x", r) for r in range(2)]
    kind = change.pop("kind", AR)
    bad = req("x", 2, kind, **change)
    out = one_cycle(c, [good[0]], [good[1]], [bad])
    assert len(out) == 1 and out[0].kind == ResponseKind.ERROR
    assert out[0].names == ("x",)
    assert re.match(message, out[0].message), out[0].message
    assert "Every rank must submit the same collective" in out[0].message


def test_broadcast_root_mismatch() -> None:
    c = Coordinator(2)
    out = one_cycle(c, [req("b", 0, CollectiveKind.BROADCAST, root_rank=0)],
                    [req("b", 1, CollectiveKind.BROADCAST, root_rank=1)])
    assert out[0].message.startswith(
        "Mismatched BROADCAST root ranks for 'b': root rank 0 on rank [0]; root rank 1 on rank [1].")


def test_allgather_first_dimension_may_differ_but_not_the_rest() -> None:
    c = Coordinator(2)
    out = one_cycle(c, [req("g", 0, CollectiveKind.ALLGATHER, shape=(1, 3))],
                    [req("g", 1, CollectiveKind.ALLGATHER, shape=(4, 3))])
    assert out[0].kind == "allgather" and out[0].sizes == ((1, 4),)
    out = one_cycle(c, [req("h", 0, CollectiveKind.ALLGATHER, shape=(1, 3))],
                    [req("h", 1, CollectiveKind.ALLGATHER, shape=(1, 2))])
    assert out[0].message.startswith(
        "Mismatched ALLGATHER tensor shapes for 'h': dimensions after the first must match: "
        "[?, 3] on rank [0]; [?, 2] on rank [1].")
    out = one_cycle(c, [req("k", 0, CollectiveKind.ALLGATHER, shape=(1, 3))],
                    [req("k", 1, CollectiveKind.ALLGATHER, shape=(1,))])
    assert "a tensor of rank 2 [1, 3] on rank [0]; a tensor of rank 1 [1] on rank [1]" in out[0].message


def test_scalar_refused_for_allgather_alltoall_reducescatter() -> None:
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL, CollectiveKind.REDUCESCATTER):
        c = Coordinator(2)
        out = one_cycle(c, [req("s", 0, kind, shape=())], [req("s", 1, kind, shape=())])
        assert out[0].kind == ResponseKind.ERROR
        assert out[0].message.startswith(f"{kind.upper} of 's' needs a tensor with at least one dimension")


def test_alltoall_split_matrix() -> None:
    c = Coordinator(2)
    out = one_cycle(c, [req("t", 0, CollectiveKind.ALLTOALL, shape=(3, 2), splits=(1, 2))],
                    [req("t", 1, CollectiveKind.ALLTOALL, shape=(4, 2))])
    assert out[0].sizes == (((1, 2), (2, 2)),)


def test_join_completes_tensors_without_joined_ranks_and_reports_last_joined() -> None:
    c = Coordinator(3)
    join = lambda r: Request("join.noname", CollectiveKind.JOIN, r)  # noqa: E731
    assert one_cycle(c, [join(0)], [req("a", 1)], []) == []
    out = one_cycle(c, [], [], [req("a", 2)])
    assert [r.names for r in out] == [("a",)]
    out = one_cycle(c, [], [join(1)], [req("g", 2, CollectiveKind.ALLGATHER)])
    assert out[0].kind == ResponseKind.ERROR
    assert out[0].message.startswith("Allgather is not supported with Join at this time.")
    out = one_cycle(c, [], [], [join(2)])
    assert out[-1].kind == "join" and out[-1].last_joined == 2
    # joined state is cleared: a new tensor waits for everyone again
    assert one_cycle(c, [req("b", 0)], [], []) == []


def test_group_responds_only_when_every_member_is_ready_in_member_order() -> None:
    c = Coordinator(2)
    g = dict(group="grp", group_size=2)
    out = one_cycle(c, [req("grp_2of2", 0, **g), req("grp_1of2", 0, **g)], [req("grp_2of2", 1, **g)])
    assert out == []
    out = one_cycle(c, [], [req("grp_1of2", 1, **g)])
    assert [r.names[0] for r in out] == ["grp_1of2", "grp_2of2"]


def test_process_set_readiness_uses_set_members() -> None:
    c = Coordinator(3, {1: (0, 2)})
    out = one_cycle(c, [req("p", 0, process_set_id=1)], [], [req("p", 2, process_set_id=1)])
    assert [r.names for r in out] == [("p",)] and out[0].process_set_id == 1


def test_add_process_set_assigns_ids_and_refuses_duplicates() -> None:
    c = Coordinator(2)
    add = lambda r, ranks: Request("add.1", CollectiveKind.ADD_PROCESS_SET, r, ranks=ranks)  # noqa: E731
    out = one_cycle(c, [add(0, (0,))], [add(1, (0,))])
    assert out[0].kind == "add_process_set" and out[0].process_set_id == 1 and out[0].ranks == (0,)
    dup = lambda r: Request("add.2", CollectiveKind.ADD_PROCESS_SET, r, ranks=(0,))  # noqa: E731
    out = one_cycle(c, [dup(0)], [dup(1)])
    assert out[0].message.startswith("Attempted to add a duplicate process set")


def test_shutdown_response_names_ranks() -> None:
    c = Coordinator(3)
    out = one_cycle(c, [], [Request("shutdown", CollectiveKind.SHUTDOWN, 1)], [])
    assert out[-1].kind == "shutdown" and out[-1].ranks == (1,)


def test_same_rank_submitting_a_name_twice_is_an_error() -> None:
    c = Coordinator(2)
    out = one_cycle(c, [req("d", 0), req("d", 0)], [])
    assert out[0].kind == ResponseKind.ERROR and "twice" in out[0].message


def test_reducescatter_rows() -> None:
    assert reducescatter_rows(5, 3) == [2, 2, 1]
    assert reducescatter_rows(2, 3) == [1, 1, 0]
    assert reducescatter_rows(6, 2) == [3, 3]


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 4),
    names=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True),
    data=st.data(),
)
def test_every_tensor_responds_exactly_once_after_every_rank_submitted(size, names, data) -> None:
    """Ranks submit the same names in their own random orders, spread over random cycles."""
    c = Coordinator(size)
    remaining = [data.draw(st.permutations(names)) for _ in range(size)]
    submitted: dict[str, set[int]] = {n: set() for n in names}
    responded: list[str] = []
    for _ in range(100):
        if not any(remaining):
            break
        lists = []
        for rank in range(size):
            k = data.draw(st.integers(0, len(remaining[rank])))
            chunk, remaining[rank] = remaining[rank][:k], remaining[rank][k:]
            lists.append([req(n, rank) for n in chunk])
            for n in chunk:
                submitted[n].add(rank)
        for response in c.handle(lists, now=0.0):
            assert response.kind == "allreduce"
            for n in response.names:
                assert submitted[n] == set(range(size)), "ran before every rank submitted"
                responded.append(n)
    while any(remaining):  # flush: submit everything left
        lists = [[req(n, r) for n in remaining[r]] for r in range(size)]
        remaining = [[] for _ in range(size)]
        responded += [n for resp in c.handle(lists, now=0.0) for n in resp.names]
    assert sorted(responded) == sorted(names)  # exactly once each


def test_a_failing_rank_aborts_the_job_with_the_lowest_failing_ranks_reason() -> None:
    c = Coordinator(3)
    fail = lambda r: Request("shutdown", CollectiveKind.SHUTDOWN, r, reason=f"rank {r} failed")  # noqa: E731
    out = one_cycle(c, [req("a", 0)], [fail(1), req("a", 1)], [fail(2)])
    assert [(r.kind, r.message) for r in out] == [(ResponseKind.ABORT, "rank 1 failed")]
    # an orderly shutdown (no reason) is not an abort
    out = one_cycle(Coordinator(2), [], [Request("shutdown", CollectiveKind.SHUTDOWN, 1)])
    assert out[-1].kind == "shutdown"


def test_ranks_sharing_one_request_list_are_told_apart_by_position() -> None:
    # Identical payloads are decoded once: ranks 0-2 hand in the very same list (whose requests say
    # rank 0); the coordinator must take each rank from the list's position.
    c = Coordinator(4)
    shared = [req("x", 0), req("y", 0, shape=(8,))]
    out = one_cycle(c, shared, shared, shared, [req("x", 3), req("y", 3, shape=(9,))])
    assert [r.names for r in out] == [("x",), ("y",)]
    assert out[0].kind == "allreduce"
    assert out[1].kind == ResponseKind.ERROR
    assert "[8] on ranks [0, 1, 2]; [9] on rank [3]" in out[1].message
    gathered = [req("g", 0, CollectiveKind.ALLGATHER, shape=(2, 3))]
    out = one_cycle(c, gathered, [req("g", 1, CollectiveKind.ALLGATHER, shape=(5, 3))], gathered, gathered)
    assert out[0].sizes == ((2, 5, 2, 2),)
    again = [req("z", 0)]
    out = one_cycle(c, again, again, [], [])
    out = one_cycle(c, again, [], [], [])  # rank 0 again before z completed
    assert out[0].kind == ResponseKind.ERROR and out[0].message.startswith("Rank 0 submitted allreduce 'z' twice")


def test_joins_from_a_shared_list_report_the_highest_rank_joined_last() -> None:
    c = Coordinator(3)
    join = [Request("join.noname", CollectiveKind.JOIN, 1)]
    assert one_cycle(c, [Request("join.noname", CollectiveKind.JOIN, 0)], [], []) == []
    out = one_cycle(c, [], join, join)
    assert out[-1].kind == "join" and out[-1].last_joined == 2
