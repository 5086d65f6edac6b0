"""The lockstep plugin's pure helpers: barrier names on the wire and the messages it reports."""

from __future__ import annotations

import pytest

from unison.testing._barrier import (
    BARRIER_SECONDS_VARIABLE,
    DEFAULT_BARRIER_SECONDS,
    NAME_BYTES,
    barrier_seconds,
    decode_name,
    describe_mismatch,
    describe_timeout,
    encode_name,
)


def test_mismatch_names_each_rank_and_groups_ranks_at_the_same_point() -> None:
    message = describe_mismatch({2: "the start of t::a", 0: "the start of t::a", 1: "the end of t::b"})
    assert message is not None
    assert message.startswith(
        "ranks are not at the same point of the suite: ranks [0, 2] are at 'the start of t::a'; "
        "rank 1 is at 'the end of t::b'. Every rank must run the same tests"
    )


def test_no_mismatch_when_all_ranks_agree() -> None:
    assert describe_mismatch({0: "x", 1: "x", 2: "x"}) is None
    assert describe_mismatch({0: "x"}) is None


def test_timeout_message_names_the_missing_ranks_the_barrier_and_the_limit() -> None:
    assert (
        describe_timeout([3, 1], "the end of t::hang", 60.0)
        == "ranks [1, 3] did not reach the barrier for the end of t::hang within 60 s"
    )
    assert describe_timeout([1], "x", 0.25).endswith("within 0.25 s")


def test_names_round_trip_in_a_fixed_size_buffer() -> None:
    for name in ["", "the start of tests/multirank/test_x.py::test_y[float32-Sum]", "ünïcode ✓"]:
        encoded = encode_name(name)
        assert len(encoded) == NAME_BYTES
        assert decode_name(bytearray(encoded)) == name


def test_long_names_that_differ_only_past_the_buffer_still_differ() -> None:
    prefix = "the start of tests/multirank/test_x.py::test_y[" + "a" * 300
    first, second = encode_name(prefix + "1]"), encode_name(prefix + "2]")
    assert len(first) == len(second) == NAME_BYTES
    assert first != second
    assert decode_name(first) != decode_name(second)
    assert decode_name(first).startswith("the start of tests/multirank/test_x.py::test_y[aaa")
    assert decode_name(first) == decode_name(encode_name(prefix + "1]"))


def test_barrier_seconds_default_and_override() -> None:
    assert barrier_seconds({}) == DEFAULT_BARRIER_SECONDS == 60.0
    assert barrier_seconds({BARRIER_SECONDS_VARIABLE: ""}) == 60.0
    assert barrier_seconds({BARRIER_SECONDS_VARIABLE: "2.5"}) == 2.5


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_barrier_seconds_refuses_a_bad_value_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=rf"UNISON_TEST_BARRIER_SECONDS must be a positive number of seconds\. Got '{value}'\."):
        barrier_seconds({BARRIER_SECONDS_VARIABLE: value})
