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
