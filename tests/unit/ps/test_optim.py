"""Server-side optimizers against torch.optim on the same gradients, and their argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from unison.errors import InvalidArgumentError
from unison.ps.optim import SGD, Adagrad, Adam, Momentum, from_fields

torch = pytest.importorskip("torch")

CASES = [
    (SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (Momentum(0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (Adagrad(0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
    (Adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
]


@pytest.mark.parametrize(("spec", "make"), CASES, ids=[c[0].kind for c in CASES])
def test_dense_updates_match_torch(spec, make) -> None:
    rng = np.random.default_rng(0)
    start = rng.standard_normal(6).astype(np.float32)
    values = start[None, :].copy()
    slots, steps = spec.new_slots(values.shape), np.zeros(1, np.int64)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = make([param])
    for _ in range(5):
        grad = rng.standard_normal(6).astype(np.float32)
        spec.apply(values, slots, steps, np.array([0]), grad[None, :])
        param.grad = torch.from_numpy(grad)
        opt.step()
    np.testing.assert_allclose(values[0], param.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_table_rows_advance_only_when_they_get_a_gradient() -> None:
    spec = Adam(0.1)
    values = np.zeros((3, 2), np.float32)
    slots, steps = spec.new_slots(values.shape), np.zeros(3, np.int64)
    spec.apply(values, slots, steps, np.array([0, 2]), np.ones((2, 2), np.float32))
    spec.apply(values, slots, steps, np.array([2]), np.ones((1, 2), np.float32))
    assert steps.tolist() == [1, 0, 2]
    assert (values[1] == 0).all()
    np.testing.assert_allclose(values[0], [-0.1, -0.1], rtol=1e-5)  # Adam's first step is lr * sign


def test_wire_form_round_trips_and_is_checked() -> None:
    spec = Momentum(0.5, momentum=0.8)
    assert from_fields(spec.kind, spec.fields()) == spec
    with pytest.raises(InvalidArgumentError, match=r"optimizer must be one of \['adagrad', 'adam', 'momentum', 'sgd'\]. Got 'rmsprop'"):
        from_fields("rmsprop", {})
    with pytest.raises(InvalidArgumentError, match=r"optimizer 'sgd' takes \['learning_rate'\]; got unknown \['beta1'\]"):
        from_fields("sgd", {"beta1": 0.9})
    with pytest.raises(InvalidArgumentError, match=r"learning_rate must be in \(0.0, inf\). Got learning_rate=-1.0"):
        from_fields("sgd", {"learning_rate": -1.0})
    with pytest.raises(InvalidArgumentError, match=r"beta2 must be in \[0.0, 1.0\). Got beta2=1.0"):
        Adam(beta2=1.0)


@pytest.mark.parametrize(("spec", "make", "state"), [
    (Adagrad(0.05), lambda p: torch.optim.Adagrad(p, lr=0.05), {"accumulator": "sum"}),
    (Adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01), {"m": "exp_avg", "v": "exp_avg_sq"}),
], ids=["adagrad", "adam"])
def test_optimizer_state_is_torchs_bit_for_bit_over_many_steps(spec, make, state) -> None:
    """The state follows torch's float32 operations exactly (constants rounded once from float64, fused
    multiply-adds where torch fuses); the values stay within a few float32 ulps (torch's sqrt is not
    correctly rounded, NumPy's is). Adam's 1 - beta2, rounded from float32(beta2), used to drift 1e-6
    in 20 steps and carried a parameter-server job's rows 4e-6 to 6e-6 away from torch."""
    rng = np.random.default_rng(1)
    start = rng.standard_normal((1, 1000)).astype(np.float32)
    values, slots, steps = start.copy(), spec.new_slots(start.shape), np.zeros(1, np.int64)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = make([param])
    for _ in range(20):
        grad = (rng.standard_normal((1, 1000)) * 0.01).astype(np.float32)
        spec.apply(values, slots, steps, np.array([0]), grad)
        param.grad = torch.from_numpy(grad.copy())
        opt.step()
        for ours, theirs in state.items():
            np.testing.assert_array_equal(slots[ours], opt.state[param][theirs].numpy(), err_msg=ours)
    np.testing.assert_allclose(values, param.detach().numpy(), rtol=0, atol=2e-7)
