"""How the unison backend reads torch's reduce ops: PREMUL_SUM's factor in every torch it supports."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from unison.adapters.torch.process_group import _op  # noqa: E402
from unison.errors import UnisonNotImplementedError  # noqa: E402
from unison.ops import ReduceOp  # noqa: E402


class _OldPremulSum:
    """torch 2.11's PREMUL_SUM op: no ``factor`` attribute, the factor in its pickled state only."""

    def __init__(self, factor: object) -> None:
        self.op, self._factor = dist.ReduceOp.PREMUL_SUM, factor

    def __getstate__(self) -> tuple[object, object]:
        return (self.op, self._factor)


@pytest.mark.parametrize("factor", [0.25, torch.tensor(0.25)])
def test_premul_sum_factor_from_torchs_op(factor: object) -> None:
    assert _op(dist._make_nccl_premul_sum(factor)) == (ReduceOp.SUM, None, 0.25)


@pytest.mark.parametrize("factor", [0.25, torch.tensor(0.25)])
def test_premul_sum_factor_from_the_pickled_state_where_torch_has_no_factor_attribute(factor: object) -> None:
    assert _op(_OldPremulSum(factor)) == (ReduceOp.SUM, None, 0.25)


def test_an_unreadable_premul_factor_is_refused_not_summed_unscaled() -> None:
    class Opaque:
        op = dist.ReduceOp.PREMUL_SUM

    with pytest.raises(UnisonNotImplementedError, match="PREMUL_SUM.*ReduceOp.SUM"):
        _op(Opaque())


def test_plain_ops_have_no_factor() -> None:
    assert _op(dist.ReduceOp.AVG) == (ReduceOp.AVERAGE, None, 1.0)
    assert _op(dist.ReduceOp.SUM) == (ReduceOp.SUM, None, 1.0)
