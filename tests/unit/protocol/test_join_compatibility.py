"""Which collectives may run while ranks have joined: `join_conflict` and the Coordinator's use of it."""

from __future__ import annotations

import pytest

from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol.messages import Request, Response, ResponseKind
from unison.protocol.negotiation import Coordinator, join_conflict

K = CollectiveKind
MESSAGES = {
    K.ALLGATHER: "Allgather is not supported with Join at this time. "
    "Specify sparse_as_dense=True if using DistributedOptimizer.",
    K.ALLTOALL: "Alltoall is not supported with Join at this time.",
    K.BROADCAST: "Broadcast is not supported with Join at this time.",
    K.REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
}


def req(name: str, rank: int, kind: CollectiveKind, **kw: object) -> Request:
    kw.setdefault("dtype", DType.FLOAT32)
    kw.setdefault("shape", (6,))
    if kind is K.BROADCAST:
        kw.setdefault("root_rank", 0)
    return Request(name, kind, rank, **kw)  # type: ignore[arg-type]


def join(rank: int) -> Request:
    return Request("join.noname", K.JOIN, rank)


def summary(responses: list[Response]) -> list[tuple[str, tuple[str, ...]]]:
    return [(r.kind.value, r.names) for r in responses]


@pytest.mark.parametrize("kind", sorted(MESSAGES, key=str))
def test_a_joined_member_rules_out_gather_scatter_and_broadcast(kind: CollectiveKind) -> None:
    assert join_conflict(kind, members=(0, 1, 2), joined={2}) == f"{MESSAGES[kind]} Joined rank [2]."
    assert join_conflict(kind, members=(0, 1, 2), joined={0, 2}) == f"{MESSAGES[kind]} Joined ranks [0, 2]."


@pytest.mark.parametrize("kind", [K.ALLREDUCE, K.BARRIER, K.JOIN])
def test_reductions_barriers_and_joins_run_with_joined_ranks(kind: CollectiveKind) -> None:
    assert join_conflict(kind, members=(0, 1, 2), joined={1}) == ""


@pytest.mark.parametrize("kind", sorted(MESSAGES, key=str))
def test_only_joined_members_of_the_collectives_set_count(kind: CollectiveKind) -> None:
    assert join_conflict(kind, members=(0, 1, 2), joined=set()) == ""
    # rank 2 joined but is not in the set {0, 1}: the collective does not involve it
    assert join_conflict(kind, members=(0, 1), joined={2}) == ""
    assert join_conflict(kind, members=(0, 1), joined={1, 2}) == f"{MESSAGES[kind]} Joined rank [1]."


@pytest.mark.parametrize("kind", sorted(MESSAGES, key=str))
def test_the_callers_get_an_error_for_that_name_alone_and_everyone_can_join(kind: CollectiveKind) -> None:
    c = Coordinator(3)
    assert c.handle([[], [], [join(2)]], now=0.0) == []
    # ranks 0 and 1 call the collective (in different cycles), and an allreduce runs beside it
    assert c.handle([[req("x", 0, kind), req("sum", 0, K.ALLREDUCE)], [], []], now=0.1) == []
    out = c.handle([[], [req("x", 1, kind), req("sum", 1, K.ALLREDUCE)], []], now=0.2)
    assert summary(out) == [("error", ("x",)), ("allreduce", ("sum",))]
    assert out[0].message == f"{MESSAGES[kind]} Joined rank [2]."
    assert c.pending() == {}
    # the callers then join: the joined rank's join completes
    out = c.handle([[join(0)], [join(1)], []], now=0.3)
    assert summary(out) == [("join", ("join",))] and out[0].last_joined == 1


@pytest.mark.parametrize("kind", sorted(MESSAGES, key=str))
def test_a_join_after_the_callers_submitted_fails_the_waiting_collective(kind: CollectiveKind) -> None:
    c = Coordinator(3)
    assert c.handle([[req("x", 0, kind)], [req("x", 1, kind)], []], now=0.0) == []
    out = c.handle([[], [], [join(2)]], now=0.1)
    assert summary(out) == [("error", ("x",))]
    assert c.statistics().errors == 1


def test_every_member_of_a_group_gets_the_error() -> None:
    c = Coordinator(2)
    group = dict(group="gag", group_size=2)
    members = [req(f"gag_{i}of2", 0, K.ALLGATHER, **group) for i in (1, 2)]
    out = c.handle([members, [join(1)]], now=0.0)
    assert summary(out) == [("error", ("gag_1of2",)), ("error", ("gag_2of2",))]


def test_a_set_without_joined_ranks_runs_its_collectives() -> None:
    c = Coordinator(3, process_sets={1: (0, 1)})
    kinds = [K.BROADCAST, K.ALLGATHER, K.ALLTOALL, K.REDUCESCATTER]
    assert c.handle([[], [], [join(2)]], now=0.0) == []
    out = c.handle([[req(f"s{i}", r, k, process_set_id=1) for i, k in enumerate(kinds)] for r in (0, 1)]
                   + [[]], now=0.1)
    assert summary(out) == [(k.value, (f"s{i}",)) for i, k in enumerate(kinds)]
    # the same collectives in the global set are refused: rank 2 is one of its members
    out = c.handle([[req("w", r, K.BROADCAST)] for r in (0, 1)] + [[]], now=0.2)
    assert summary(out) == [("error", ("w",))]


def test_the_joined_state_ends_with_the_join_response() -> None:
    c = Coordinator(2)
    c.handle([[join(0)], [join(1)]], now=0.0)
    out = c.handle([[req("b", 0, K.BROADCAST)], [req("b", 1, K.BROADCAST)]], now=0.1)
    assert summary(out) == [("broadcast", ("b",))]
    assert out[0].kind is ResponseKind.BROADCAST
