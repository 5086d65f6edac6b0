"""Checks across pending names: one user name under two kinds, unnamed calls out of step."""

from __future__ import annotations

import pytest

from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol.messages import Request, ResponseKind
from unison.protocol.names import kind_conflict, split_name, unnamed_drift, unnamed_index
from unison.protocol.negotiation import Coordinator

AR = CollectiveKind.ALLREDUCE
BC = CollectiveKind.BROADCAST


def req(name: str, rank: int, kind: CollectiveKind = AR, **kw: object) -> Request:
    kw.setdefault("dtype", DType.FLOAT32)
    kw.setdefault("shape", (4,))
    if kind is BC:
        kw.setdefault("root_rank", 0)
    return Request(name, kind, rank, **kw)  # type: ignore[arg-type]


def test_split_name_and_unnamed_index() -> None:
    assert split_name("grouped_allreduce.noname.7_2of3") == ("grouped_allreduce", "noname.7_2of3")
    assert unnamed_index("noname.7_2of3") == 7
    assert unnamed_index("noname.7") == 7
    assert unnamed_index("noname.set2.7") == 7  # an unnamed call in process set 2
    assert unnamed_index("noname.set2.7_1of2") == 7
    assert unnamed_index("noname.set2") is None  # a set's barrier: no call number
    assert unnamed_index("noname") is None
    assert unnamed_index("my.noname.7") is None


def test_kind_conflict_waits_for_every_expected_rank() -> None:
    both = {"allreduce": frozenset({0}), "broadcast": frozenset({1})}
    assert kind_conflict("x", both, frozenset({0, 1, 2})) == ""
    text = kind_conflict("x", both, frozenset({0, 1}))
    assert text.startswith("Mismatched operations for 'x': ALLREDUCE on rank [0]; BROADCAST on rank [1].")
    assert kind_conflict("x", {"allreduce": frozenset({0, 1})}, frozenset({0, 1})) == ""


@pytest.mark.parametrize(
    ("pending", "drifted"),
    [
        ([(5, "allreduce", frozenset({1})), (6, "allreduce", frozenset({0}))], True),
        # rank 0 is simply ahead: it waits in 5 and 6, rank 1 has sent 5 only
        ([(5, "allreduce", frozenset({0, 1})), (6, "allreduce", frozenset({0}))], False),
        ([(5, "allreduce", frozenset({0})), (6, "allreduce", frozenset({0}))], False),
        # async: rank 1 sent 6 and 7 while rank 0 is still at 6 and never asked for 5's partner
        ([(6, "allreduce", frozenset({0, 1})), (7, "allreduce", frozenset({1}))], False),
        ([(4, "allreduce", frozenset({2})), (5, "broadcast", frozenset({1})),
          (9, "allreduce", frozenset({0}))], True),
        ([(3, "allreduce", frozenset({0}))], False),
    ],
)
def test_unnamed_drift_is_reported_only_when_a_rank_passed_a_call(pending, drifted: bool) -> None:
    assert bool(unnamed_drift(pending, 0)) is drifted


def test_unnamed_drift_names_every_rank_and_position() -> None:
    text = unnamed_drift([(384, "allreduce", frozenset({0})), (390, "allreduce", frozenset({1}))], 0)
    assert text.startswith("Unnamed collectives are out of step: rank 0 is at unnamed allreduce #384, "
                           "rank 1 at #390.")
    text = unnamed_drift([(4, "allreduce", frozenset({2})), (5, "broadcast", frozenset({0, 1}))], 3)
    assert "in process set 3: ranks [0, 1] are at unnamed broadcast #5, rank 2 at unnamed allreduce #4." \
        in text


def test_coordinator_reports_allreduce_and_broadcast_under_one_name() -> None:
    c = Coordinator(2)
    assert c.handle([[req("allreduce.x", 0)], []], now=0.0) == []
    out = c.handle([[], [req("broadcast.x", 1, BC)]], now=0.1)
    assert sorted(r.names for r in out) == [("allreduce.x",), ("broadcast.x",)]
    assert {r.kind for r in out} == {ResponseKind.ERROR}
    assert out[0].message.startswith("Mismatched operations for 'x': ALLREDUCE on rank [0]; BROADCAST on rank [1].")
    assert c.pending() == {}


def test_coordinator_waits_while_some_rank_has_not_asked_yet() -> None:
    c = Coordinator(3)
    assert c.handle([[req("allreduce.x", 0)], [req("broadcast.x", 1, BC)], []], now=0.0) == []
    out = c.handle([[], [], [req("allreduce.x", 2)]], now=0.1)
    assert {r.kind for r in out} == {ResponseKind.ERROR}
    assert "ALLREDUCE on ranks [0, 2]; BROADCAST on rank [1]" in out[0].message


def test_coordinator_reports_unnamed_calls_out_of_step_at_once() -> None:
    c = Coordinator(2)
    # Both ranks agree on #1 and #2; rank 0 then skipped #3 (it raised before submitting).
    out = c.handle([[req("allreduce.noname.1", 0), req("allreduce.noname.2", 0)],
                    [req("allreduce.noname.1", 1), req("allreduce.noname.2", 1)]], now=0.0)
    assert [r.names for r in out] == [("allreduce.noname.1",), ("allreduce.noname.2",)]
    assert c.handle([[], [req("allreduce.noname.3", 1)]], now=0.1) == []
    out = c.handle([[req("allreduce.noname.4", 0)], []], now=0.2)
    assert sorted(r.names for r in out) == [("allreduce.noname.3",), ("allreduce.noname.4",)]
    assert all(r.kind == ResponseKind.ERROR for r in out)
    assert "rank 0 is at unnamed allreduce #4, rank 1 at #3" in out[0].message
    assert c.pending() == {}


def test_coordinator_unnamed_calls_in_step_run_normally() -> None:
    c = Coordinator(2)
    assert c.handle([[req("allreduce.noname.1", 0), req("allreduce.noname.2", 0)], []], now=0.0) == []
    out = c.handle([[], [req("allreduce.noname.1", 1), req("allreduce.noname.2", 1)]], now=0.1)
    assert [r.names for r in out] == [("allreduce.noname.1",), ("allreduce.noname.2",)]
    assert ResponseKind.ERROR not in {r.kind for r in out}


def test_coordinator_unnamed_calls_of_other_process_sets_do_not_interfere() -> None:
    c = Coordinator(3, {1: (0, 1)})
    assert c.handle([[req("allreduce.noname.1", 0, process_set_id=1)], [],
                     [req("allreduce.noname.5", 2)]], now=0.0) == []
    assert c.statistics().errors == 0

