"""Call sites in requests: carried on the wire, never compared, named by the coordinator's messages."""

from __future__ import annotations

import doctest

from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol import negotiation
from unison.protocol.messages import Request, ResponseKind, decode_request_lists, encode_requests
from unison.protocol.negotiation import Coordinator

AR = CollectiveKind.ALLREDUCE


def req(name: str, rank: int, site: str = "", **kw: object) -> Request:
    kw.setdefault("dtype", DType.FLOAT32)
    kw.setdefault("shape", (4,))
    return Request(name, AR, rank, site=site, **kw)  # type: ignore[arg-type]


def test_a_site_travels_on_the_wire_and_an_empty_one_adds_nothing() -> None:
    with_site = req("x", 0, site="train.py:41 in step <- train.py:60 in main (DDP bucket 0)")
    assert decode_request_lists([encode_requests([with_site])])[0] == [with_site]
    assert b"site" not in encode_requests([req("x", 0)])  # the format of a request without one is unchanged


def test_ranks_that_agree_but_were_called_from_different_lines_run_the_collective() -> None:
    c = Coordinator(2)
    out = c.handle([[req("x", 0, "a.py:1 in f")], [req("x", 1, "a.py:2 in f")]], now=0.0)
    assert [r.kind for r in out] == [ResponseKind.ALLREDUCE]


def test_a_mismatch_names_each_rank_s_call_site_grouped() -> None:
    c = Coordinator(3)
    out = c.handle([[req("x", 0, "t.py:5 in main")], [req("x", 1, "t.py:4 in main", shape=(5,))],
                    [req("x", 2, "t.py:5 in main")]], now=0.0)
    assert out[0].kind is ResponseKind.ERROR
    assert out[0].message == (
        "Mismatched ALLREDUCE tensor shapes for 'x': [4] on ranks [0, 2]; [5] on rank [1]. Every rank must submit "
        "the same collective with the same attributes under one name. Called at t.py:5 in main on ranks [0, 2]; "
        "t.py:4 in main on rank [1].")


def test_a_mismatch_without_sites_reads_as_before() -> None:
    c = Coordinator(2)
    out = c.handle([[req("x", 0)], [req("x", 1, shape=(5,))]], now=0.0)
    assert "Called at" not in out[0].message and out[0].message.startswith("Mismatched ALLREDUCE tensor shapes")


def test_unnamed_calls_out_of_step_name_where_each_rank_made_its_last_one() -> None:
    c = Coordinator(2)
    c.handle([[req("allreduce.noname.1", 0, "m.py:9 in main")], []], now=0.0)
    out = c.handle([[], [req("allreduce.noname.2", 1, "m.py:3 in main")]], now=0.1)
    assert [r.kind for r in out] == [ResponseKind.ERROR, ResponseKind.ERROR]
    assert out[0].message.startswith("Unnamed collectives are out of step")
    assert out[0].message.endswith(" Called at m.py:9 in main on rank [0]; m.py:3 in main on rank [1].")


def test_the_pending_names_sites_are_one_rank_s() -> None:
    c = Coordinator(3)
    c.handle([[req("x", 0, "t.py:5 in main")], [req("y", 1)], []], now=0.0)
    assert c.sites() == {"x": "t.py:5 in main"}


def test_the_examples_hold() -> None:
    assert doctest.testmod(negotiation).failed == 0
