"""The framework-free gradient policy (`unison._job.gradients`): validation texts, scale factors, names."""

from __future__ import annotations

import dataclasses

import pytest

from unison._job.gradients import (
    Framework,
    aggregation_divisor,
    allreduce_scaling,
    bucket_name,
    check_passes,
    gradient_group_name,
    gradient_policy,
    local_divisor,
    partial_name,
    self_reduced_scale,
    sparse_name,
    sparsified_name,
    split_local,
)
from unison.compression import Compression, Exchange
from unison.errors import InvalidArgumentError
from unison.ops import ReduceOp
from unison.process_sets import global_process_set

ALL = list(Framework)


def policy(framework: Framework = Framework.TORCH, **kwargs):
    kwargs.setdefault("op", ReduceOp.AVERAGE)
    return gradient_policy(framework, process_set=global_process_set, **kwargs)


# -- validation ------------------------------------------------------------------------------------


def test_the_policy_is_frozen_and_keeps_the_resolved_values() -> None:
    p = policy(Framework.KERAS, op=1, gradient_predivide_factor=1, backward_passes_per_step=3,
               average_aggregated_gradients=True, sparse_as_dense=1)
    assert (p.op, p.gradient_predivide_factor, p.backward_passes_per_step) == (ReduceOp.SUM, 1.0, 3)
    assert p.sparse_as_dense is True and p.average_aggregated_gradients is True
    assert p.exchange is Exchange.ALLREDUCE and p.process_set is global_process_set
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.op = ReduceOp.AVERAGE  # type: ignore[misc]


@pytest.mark.parametrize("framework", [Framework.TENSORFLOW, Framework.KERAS])
@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, "x", None, 99])
def test_tensorflow_and_keras_accept_only_average_and_sum(framework: Framework, op: object) -> None:
    with pytest.raises(ValueError, match=r"op currently only supports Average and Sum\. Got op="):
        policy(framework, op=op)


def test_adasum_is_for_the_tape_and_torch_not_keras_nor_with_a_sparsifier() -> None:
    assert policy(Framework.TENSORFLOW, op=ReduceOp.ADASUM).op is ReduceOp.ADASUM
    assert policy(Framework.TORCH, op=ReduceOp.ADASUM).op is ReduceOp.ADASUM
    with pytest.raises(ValueError, match=r"op == Adasum is not supported yet with Keras"):
        policy(Framework.KERAS, op=ReduceOp.ADASUM)
    with pytest.raises(ValueError, match=r"cannot be combined with op=Adasum"):
        policy(Framework.TORCH, op=ReduceOp.ADASUM, compression=Compression.topk(0.1))
    with pytest.raises(ValueError, match=r"gradient_predivide_factor not supported with op != Average"):
        policy(Framework.TENSORFLOW, op=ReduceOp.ADASUM, gradient_predivide_factor=2.0)


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.SUM])
def test_torch_accepts_every_op(op: ReduceOp) -> None:
    assert policy(op=int(op)).op is op
    with pytest.raises(InvalidArgumentError, match=r"op must be one of Average, Sum"):
        policy(op="x")


@pytest.mark.parametrize("framework", ALL)
def test_predivide_needs_average(framework: Framework) -> None:
    with pytest.raises(ValueError, match=r"gradient_predivide_factor not supported with op != Average\. "
                                         r"Got gradient_predivide_factor=2\.0 with op=SUM\."):
        policy(framework, op=ReduceOp.SUM, gradient_predivide_factor=2.0)


@pytest.mark.parametrize("framework", ALL)
@pytest.mark.parametrize("passes", [0, -1, 1.5, "2", None])
def test_passes_must_be_a_positive_integer(framework: Framework, passes: object) -> None:
    with pytest.raises(ValueError, match=r"backward_passes_per_step must be an integer >= 1\. Got "):
        policy(framework, backward_passes_per_step=passes)
    with pytest.raises(ValueError, match=r"backward_passes_per_step must be an integer >= 1\. Got 0\."):
        check_passes(0)


def test_torch_compression_exchanges_need_average_or_sum() -> None:
    for compression in (Compression.topk(0.5), Compression.powersgd(1)):
        assert policy(op=ReduceOp.SUM, compression=compression).exchange is not Exchange.ALLREDUCE
        with pytest.raises(ValueError, match=r"supports op=Average .* Got op=MAX\."):
            policy(op=ReduceOp.MAX, compression=compression)
    assert policy(compression=Compression.partial(0.5), backward_passes_per_step=2).exchange is Exchange.PARTIAL
    with pytest.raises(ValueError, match=r"supports op=Average .* Got op=SUM\."):
        policy(op=ReduceOp.SUM, compression=Compression.partial(0.5))


def test_keras_partial_needs_average_and_one_pass() -> None:
    assert policy(Framework.KERAS, compression=Compression.partial(0.5)).exchange is Exchange.PARTIAL
    for kwargs in ({"op": ReduceOp.SUM}, {"backward_passes_per_step": 2}):
        with pytest.raises(ValueError, match=r"Compression\.partial averages parameters after every step: it "
                                             r"needs op=Average and backward_passes_per_step=1\. Got op="):
            policy(Framework.KERAS, compression=Compression.partial(0.5), **kwargs)
    assert policy(Framework.KERAS, op=ReduceOp.SUM, compression=Compression.topk(0.5)).op is ReduceOp.SUM


def test_the_tape_cannot_run_partial_synchronization() -> None:
    assert policy(Framework.TENSORFLOW, compression=Compression.threshold(0.1)).exchange is Exchange.ALLGATHER
    with pytest.raises(ValueError, match=r"cannot reduce gradients here; partial synchronization works with "
                                         r"the Keras DistributedOptimizer on the torch backend\."):
        policy(Framework.TENSORFLOW, compression=Compression.partial(0.5))


# -- scaling ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ALL)
def test_allreduce_scaling_predivides_under_average_only(framework: Framework) -> None:
    assert allreduce_scaling(policy(framework)) == (ReduceOp.AVERAGE, 1.0, 1.0)
    assert allreduce_scaling(policy(framework, gradient_predivide_factor=4)) == (ReduceOp.AVERAGE, 0.25, 4.0)
    assert allreduce_scaling(policy(framework, op=ReduceOp.SUM)) == (ReduceOp.SUM, 1.0, 1.0)
    assert allreduce_scaling(policy(op=ReduceOp.MAX)) == (ReduceOp.MAX, 1.0, 1.0)


def test_self_reduced_scale_averages_over_the_set() -> None:
    assert self_reduced_scale(policy(), 4) == 0.25
    assert self_reduced_scale(policy(gradient_predivide_factor=3.0), 2) == 0.5
    assert self_reduced_scale(policy(), None) == 1.0
    assert self_reduced_scale(policy(op=ReduceOp.SUM), 4) == 1.0


def test_local_and_aggregation_divisors() -> None:
    assert local_divisor(policy(Framework.KERAS), 3) == 3
    assert local_divisor(policy(Framework.KERAS), 1) is None
    assert local_divisor(policy(Framework.KERAS, scale_local_gradients=False), 3) is None
    assert aggregation_divisor(policy(Framework.KERAS, backward_passes_per_step=4)) is None
    assert aggregation_divisor(policy(Framework.KERAS, backward_passes_per_step=4,
                                      average_aggregated_gradients=True)) == 4
    assert aggregation_divisor(policy(Framework.KERAS, average_aggregated_gradients=True)) is None


def test_split_local_skips_absent_gradients() -> None:
    assert split_local([True, False, True, True], [False, True, True, False]) == ([0, 3], [2])
    assert split_local([True, False, True], []) == ([0, 2], [])


# -- naming ----------------------------------------------------------------------------------------


def test_group_name_depends_on_the_names_and_their_order() -> None:
    a = gradient_group_name(["dense/kernel", "dense/bias"])
    assert a == gradient_group_name(["dense/kernel", "dense/bias"])
    assert a.startswith("DistributedGradients.2.") and len(a) == len("DistributedGradients.2.") + 8
    assert a != gradient_group_name(["dense/bias", "dense/kernel"])
    assert gradient_group_name([]) == "DistributedGradients.0.00000000"


def test_collective_names_of_single_gradients() -> None:
    assert (sparse_name("w"), sparsified_name("w"), bucket_name(2), partial_name(0)) == (
        "sparse.w", "sparsified.w", "group.2", "partial.0")
