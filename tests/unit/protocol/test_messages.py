"""Wire encoding of requests and responses: lossless, JSON, never pickle."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unison.dtypes import DType
from unison.ops import COLLECTIVE_KINDS, CollectiveKind, Kind, ReduceOp
from unison.protocol.messages import (
    Request,
    Response,
    ResponseKind,
    WireError,
    decode_request_lists,
    decode_requests,
    decode_responses,
    encode_requests,
    encode_responses,
)

shapes = st.lists(st.integers(0, 10**9), max_size=4).map(tuple)
requests = st.builds(
    Request,
    name=st.text(max_size=20), kind=st.sampled_from(sorted(COLLECTIVE_KINDS)), rank=st.integers(0, 4096),
    dtype=st.sampled_from(list(DType)), shape=shapes, reduce_op=st.sampled_from(list(ReduceOp)),
    root_rank=st.integers(-1, 64), prescale=st.floats(allow_nan=False), postscale=st.floats(allow_nan=False),
    process_set_id=st.integers(0, 5), group=st.text(max_size=5), group_size=st.integers(0, 5),
    splits=shapes, ranks=shapes,
)


@given(st.lists(requests, max_size=5), st.integers(0, 4096))
def test_requests_round_trip(items, rank) -> None:
    items = [dataclasses.replace(r, rank=rank) for r in items]  # one rank's list
    data = encode_requests(items)
    assert decode_requests(data, rank) == items
    json.loads(data)  # plain JSON on the wire


@given(st.lists(requests, max_size=5), st.integers(2, 6))
def test_identical_payloads_are_decoded_once_and_shared(items, size) -> None:
    payloads = [encode_requests([dataclasses.replace(r, rank=rank) for r in items]) for rank in range(size)]
    assert len(set(payloads)) == 1  # the rank is not on the wire
    lists = decode_request_lists([*payloads[:-1], b""])
    assert lists[-1] == []
    assert lists[0] == [dataclasses.replace(r, rank=0) for r in items]
    assert all(other is lists[0] for other in lists[1:-1])  # one list, whatever the number of ranks


@given(st.lists(st.builds(
    Response, kind=st.sampled_from(["allreduce", "allgather", "error", "join"]),
    names=st.lists(st.text(max_size=8), max_size=3).map(tuple), dtype=st.sampled_from(list(DType)),
    shapes=st.lists(shapes, max_size=3).map(tuple), message=st.text(max_size=30),
    sizes=st.one_of(st.just(()), shapes.map(lambda s: (s,)),
                    st.lists(shapes, max_size=3).map(lambda m: (tuple(m),))),
    last_joined=st.integers(-1, 8),
), max_size=4))
def test_responses_round_trip(items) -> None:
    assert decode_responses(encode_responses(items)) == items


def test_one_kind_enum_under_both_names() -> None:
    assert CollectiveKind is Kind and ResponseKind is Kind
    assert Response(CollectiveKind.ALLREDUCE, ("g",)).kind is Kind.ALLREDUCE
    assert Response("tune", ()).kind is ResponseKind.TUNE
    assert sorted(k.value for k in COLLECTIVE_KINDS) == sorted([
        "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join",
        "add_process_set", "remove_process_set", "shutdown"])
    assert [k for k in Kind if not k.is_collective] == [Kind.ERROR, Kind.ABORT, Kind.STALL, Kind.TUNE]
    assert Kind.REDUCESCATTER.upper == "REDUCESCATTER"  # Horovod's spelling, a property
    assert Kind.BROADCAST == "broadcast" and f"{Kind.BROADCAST}" == "broadcast"


def test_kinds_travel_as_their_string_values() -> None:
    assert encode_requests([Request("x", CollectiveKind.JOIN, 3)]) == b'[{"name":"x","kind":"join"}]'
    assert encode_responses([Response(ResponseKind.STALL, (), message="m")]) == \
        b'[{"kind":"stall","names":[],"message":"m"}]'


def test_a_request_of_a_response_only_kind_is_refused() -> None:
    for kind in ("error", "abort", "stall", "tune", "no-such-kind"):
        with pytest.raises(WireError, match=f"'{kind}' is not a valid CollectiveKind"):
            decode_request_lists([json.dumps([{"name": "x", "kind": kind}]).encode()])
    with pytest.raises(ValueError, match="'bogus' is not a valid ResponseKind"):
        Response("bogus", ())  # type: ignore[arg-type]
