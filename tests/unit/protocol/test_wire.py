"""A negotiation payload that cannot be read is reported with the rank that sent it."""

from __future__ import annotations

import pytest

from unison.dtypes import DType
from unison.ops import CollectiveKind
from unison.protocol.messages import Request, WireError, decode_request_lists, encode_requests


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        (b"\x00garbage", "JSONDecodeError"),
        (b'[{"name":"x","kind":"no-such-kind"}]', "not a valid CollectiveKind"),
        (b'[{"name":"x","kind":"allreduce","shape":["a"]}]', "'shape' of 'x' is not a list of integers"),
        (b'[{"name":5,"kind":"allreduce"}]', "'name' of 5 is not a string"),
        (b'[{"name":"x","kind":"allreduce","bogus":1}]', "unexpected keyword argument 'bogus'"),
        (b'{"name":"x"}', "TypeError"),
    ],
)
def test_unreadable_payload_names_the_rank(payload: bytes, cause: str) -> None:
    good = encode_requests([Request("allreduce.ok", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (4,))])
    with pytest.raises(WireError, match=r"^rank 2 sent a negotiation message that rank 0 cannot read") as info:
        decode_request_lists([good, b"", payload])
    assert cause in str(info.value)
