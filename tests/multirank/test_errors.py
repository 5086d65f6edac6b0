"""Every disagreement between ranks raises on every rank with the ranks grouped by value; bad input raises at once."""

from __future__ import annotations

import re

import numpy as np
import pytest

import unison as hvd
from unison.errors import (
    DuplicateNameError,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    UnsupportedDtypeError,
)


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def odd_one_out() -> tuple[bool, str]:
    """The last rank disagrees; returns (am I the odd one, 'ranks' phrase for the others)."""
    size = hvd.size()
    others = list(range(size - 1))
    phrase = f"rank {others}" if len(others) == 1 else f"ranks {others}"
    return hvd.rank() == size - 1, re.escape(phrase)


@pytest.mark.min_ranks(2)
def test_shape_mismatch() -> None:
    odd, others = odd_one_out()
    last = hvd.size() - 1
    with pytest.raises(MismatchError, match=(
        rf"Mismatched ALLREDUCE tensor shapes for 'allreduce.shape': \[17, 3\] on {others}; "
        rf"\[18, 3\] on rank \[{last}\]\. Every rank must submit")):
        hvd.allreduce(np.ones((18 if odd else 17, 3)), name="shape")


@pytest.mark.min_ranks(2)
def test_dtype_mismatch() -> None:
    odd, others = odd_one_out()
    with pytest.raises(MismatchError, match=rf"Mismatched data types for allreduce 'allreduce.dt': float32 on {others}; int32 on rank"):
        hvd.allreduce(np.ones(3, np.int32 if odd else np.float32), name="dt")


@pytest.mark.min_ranks(2)
def test_operation_mismatch() -> None:
    """Two ranks use one name for different collectives."""
    odd, others = odd_one_out()
    last = hvd.size() - 1
    with pytest.raises(MismatchError, match=rf"Mismatched operations for 'shared.name': ALLREDUCE on {others}; ALLGATHER on rank \[{last}\]\."):
        if odd:
            hvd.allgather(np.ones(3), name="shared.name")
        else:
            hvd.allreduce(np.ones(3), name="shared.name")


@pytest.mark.min_ranks(2)
def test_reduce_op_mismatch() -> None:
    odd, others = odd_one_out()
    with pytest.raises(MismatchError, match=rf"Mismatched reduction operation for allreduce 'allreduce.rop': SUM on {others}; MAX on rank"):
        hvd.allreduce(np.ones(3), op=hvd.Max if odd else hvd.Sum, name="rop")


@pytest.mark.min_ranks(2)
def test_scale_factor_mismatch() -> None:
    odd, others = odd_one_out()
    with pytest.raises(MismatchError, match=rf"Mismatched prescale and/or postscale factors .*: \(1, 1\) on {others}; \(0.5, 1\) on rank"):
        hvd.allreduce(np.ones(3), prescale_factor=0.5 if odd else 1.0, name="scale")


@pytest.mark.min_ranks(2)
def test_broadcast_root_mismatch() -> None:
    odd, others = odd_one_out()
    with pytest.raises(MismatchError, match=rf"Mismatched BROADCAST root ranks for 'broadcast.root': root rank 0 on {others}; root rank 1 on rank"):
        hvd.broadcast(np.ones(3), root_rank=1 if odd else 0, name="root")


@pytest.mark.min_ranks(2)
def test_allgather_trailing_dimension_mismatch() -> None:
    odd, others = odd_one_out()
    with pytest.raises(MismatchError, match=r"dimensions after the first must match: \[\?, 2\] on .*; \[\?, 5\] on rank"):
        hvd.allgather(np.ones((1, 5 if odd else 2)), name="trail")


@pytest.mark.min_ranks(2)
def test_errors_do_not_break_the_job() -> None:
    odd, _ = odd_one_out()
    with pytest.raises(MismatchError):
        hvd.allreduce(np.ones(2 if odd else 3), name="recover")
    assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="recover.after")[0] == hvd.size()


def test_duplicate_name_in_flight_raises_immediately() -> None:
    handle = hvd.allreduce_async(np.ones(4), name="dup")
    with pytest.raises(DuplicateNameError, match="'allreduce.dup' while another tensor with that name") as info:
        hvd.allreduce_async(np.ones(4), name="dup")
    assert isinstance(info.value, ValueError)
    hvd.synchronize(handle)


def test_bad_input_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(UnsupportedDtypeError, match="Tensor type complex128 is not supported"):
        hvd.allreduce(np.ones(2, np.complex128))
    with pytest.raises(UnsupportedDtypeError, match="allreduce does not support dtype bool"):
        hvd.allreduce(np.ones(2, bool))
    with pytest.raises(InvalidArgumentError, match="broadcast received invalid root rank 99"):
        hvd.broadcast(np.ones(2), root_rank=99)
    with pytest.raises(InvalidArgumentError, match="Tensor is required to be contiguous"):
        hvd.allreduce_(np.ones((4, 4))[:, 0])
    with pytest.raises(InvalidArgumentError, match="Number of entries in splits does not equal number of workers"):
        hvd.alltoall(np.ones(4), splits=[4] * (hvd.size() + 1))
    with pytest.raises(InvalidArgumentError, match="Sum of splits entries is greater than the first dimension"):
        hvd.alltoall(np.ones(2), splits=[3] * hvd.size())
    with pytest.raises(InvalidArgumentError, match="alltoall expects a 1D splits tensor"):
        hvd.alltoall(np.ones(2), splits=[[1]])
    with pytest.raises(hvd.UnisonError, match="Adasum (combines floating-point|with non-power of 2)"):
        hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum)
    with pytest.raises(InvalidArgumentError, match="op must be one of"):
        hvd.allreduce(np.ones(2), op=42)
    with pytest.raises(ValueError, match="Handle 123456 was not created"):
        hvd.synchronize(123456)
    # the job still works
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.bad")[0] == hvd.size()


@pytest.mark.min_ranks(2)
def test_alltoall_rows_must_divide_evenly_among_ranks() -> None:
    with pytest.raises(InvalidArgumentError, match="not an even multiple of the number of workers"):
        hvd.alltoall(np.ones(hvd.size() + 1))
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.uneven")[0] == hvd.size()


def test_unregistered_process_set_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="Allreduce: Process set provided does not exist"):
        hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0]))


def test_calls_after_shutdown_raise_not_initialized() -> None:
    hvd.shutdown()
    with pytest.raises(NotInitializedError, match="has not been initialized"):
        hvd.allreduce(np.ones(2))
    with pytest.raises(NotInitializedError):
        hvd.rank()
    hvd.init()  # re-initialization works
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="reinit")[0] == hvd.size()
