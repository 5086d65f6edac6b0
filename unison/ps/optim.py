"""The optimizers a parameter server applies (SGD, momentum, Adagrad, Adam), in NumPy, with their state.

A server holds every block of values as rows: a table's rows, or a dense block as one row. An
optimizer updates selected rows from their gradients, with its state (`slots`) kept beside the values
row for row, and a step count per row, so a table's Adam is lazy (a row's moments and bias correction
advance only when the row gets a gradient, as Paddle's lazy mode and TensorFlow's LazyAdam) and a dense
block's Adam is the usual one.

Example:
    >>> spec = Adam(learning_rate=0.1)
    >>> values = np.zeros((1, 2), np.float32)
    >>> slots, steps = spec.new_slots(values.shape), np.zeros(1, np.int64)
    >>> spec.apply(values, slots, steps, np.array([0]), np.array([[1.0, -1.0]], np.float32))
    >>> values.round(3).tolist()
    [[-0.1, 0.1]]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["SGD", "Adagrad", "Adam", "Momentum", "Optimizer", "from_fields"]


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of float32 arrays rounded once, as the fused multiply-adds of torch's CPU kernels.

    The product of two float32 values is exact in float64; the sum is rounded to float64 and then to
    float32, which differs from one rounding only when the float64 result lies exactly halfway
    between two float32 values after its own rounding (not met in the tests against torch).
    """
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _check(name: str, value: float, low: float, high: float = math.inf, *, closed_low: bool = False) -> None:
    ok = math.isfinite(value) and (value >= low if closed_low else value > low) and value < high
    if not ok:
        bounds = f"{'[' if closed_low else '('}{low}, {high})"
        raise InvalidArgumentError(f"{name} must be in {bounds}. Got {name}={value!r}.")


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """Base of the server-side optimizers: what they are called on the wire, and their state."""

    learning_rate: float = 0.01
    kind: ClassVar[str] = ""
    slot_names: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        _check("learning_rate", self.learning_rate, 0.0)

    def fields(self) -> dict[str, float]:
        """The hyperparameters, as sent to the servers."""
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def new_slots(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Zeroed state arrays for values of `shape`."""
        return {name: np.zeros(shape, np.float32) for name in self.slot_names}

    def apply(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
              rows: np.ndarray, grads: np.ndarray) -> None:
        """Update ``values[rows]`` in place from `grads` (one row of gradient per entry of `rows`, unique)."""
        steps[rows] += 1
        self._update(values, slots, steps, rows, grads.astype(np.float32, copy=False))

    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
                rows: np.ndarray, grads: np.ndarray) -> None:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Plain gradient descent: ``w -= learning_rate * g``."""

    kind: ClassVar[str] = "sgd"

    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
                rows: np.ndarray, grads: np.ndarray) -> None:
        values[rows] -= np.float32(self.learning_rate) * grads


@dataclasses.dataclass(frozen=True)
class Momentum(Optimizer):
    """Heavy-ball momentum, as torch.optim.SGD's: ``v = momentum * v + g; w -= learning_rate * v``."""

    momentum: float = 0.9
    kind: ClassVar[str] = "momentum"
    slot_names: ClassVar[tuple[str, ...]] = ("velocity",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("momentum", self.momentum, 0.0, 1.0, closed_low=True)

    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
                rows: np.ndarray, grads: np.ndarray) -> None:
        velocity = np.float32(self.momentum) * slots["velocity"][rows] + grads
        slots["velocity"][rows] = velocity
        values[rows] -= np.float32(self.learning_rate) * velocity


@dataclasses.dataclass(frozen=True)
class Adagrad(Optimizer):
    """Adagrad, as torch.optim.Adagrad's: ``s += g*g; w -= learning_rate * g / (sqrt(s) + epsilon)``."""

    initial_accumulator: float = 0.0
    epsilon: float = 1e-10
    kind: ClassVar[str] = "adagrad"
    slot_names: ClassVar[tuple[str, ...]] = ("accumulator",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("initial_accumulator", self.initial_accumulator, 0.0, closed_low=True)
        _check("epsilon", self.epsilon, 0.0)

    def new_slots(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return {"accumulator": np.full(shape, self.initial_accumulator, np.float32)}

    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
                rows: np.ndarray, grads: np.ndarray) -> None:
        accumulator = _fma(grads, grads, slots["accumulator"][rows])  # torch's addcmul_(g, g)
        slots["accumulator"][rows] = accumulator
        # torch's addcdiv: p + ((-lr) * g) / (sqrt(s) + eps)
        values[rows] += np.float32(-self.learning_rate) * grads / (np.sqrt(accumulator) + np.float32(self.epsilon))


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """Adam, as torch.optim.Adam's (bias-corrected; per row for tables, so lazy there)."""

    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    kind: ClassVar[str] = "adam"
    slot_names: ClassVar[tuple[str, ...]] = ("m", "v")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("beta1", self.beta1, 0.0, 1.0, closed_low=True)
        _check("beta2", self.beta2, 0.0, 1.0, closed_low=True)
        _check("epsilon", self.epsilon, 0.0)

    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray], steps: np.ndarray,
                rows: np.ndarray, grads: np.ndarray) -> None:
        # torch.optim.Adam's float32 operations in its order: every constant is computed in float64
        # and rounded once (1 - beta2 taken from float32(beta2) was 1.3e-5 off for 0.999), the
        # moments are torch's lerp and addcmul (fused multiply-adds), and the step is addcdiv's
        # p + ((-step_size) * m) / denom.
        m, v = slots["m"][rows], slots["v"][rows]
        weight = np.float32(1.0 - self.beta1)
        if weight < 0.5:
            m = _fma(np.full_like(grads, weight), grads - m, m)
        else:
            m = _fma(np.full_like(grads, -np.float32(self.beta1)), grads - m, grads)
        v = _fma(np.float32(1.0 - self.beta2) * grads, grads, v * np.float32(self.beta2))
        slots["m"][rows], slots["v"][rows] = m, v
        t = steps[rows].astype(np.float64)[:, None]
        step_size = (-self.learning_rate / (1.0 - self.beta1 ** t)).astype(np.float32)
        correction2 = np.sqrt(1.0 - self.beta2 ** t).astype(np.float32)
        values[rows] += step_size * m / (np.sqrt(v) / correction2 + np.float32(self.epsilon))


_KINDS: dict[str, type[Optimizer]] = {cls.kind: cls for cls in (SGD, Momentum, Adagrad, Adam)}


def from_fields(kind: str, fields: dict[str, Any]) -> Optimizer:
    """Rebuild an optimizer from its wire form (kind and hyperparameters), checking every value.

    Raises:
        InvalidArgumentError: an unknown kind or hyperparameter, or a value out of range.
    """
    cls = _KINDS.get(kind)
    if cls is None:
        raise InvalidArgumentError(f"optimizer must be one of {sorted(_KINDS)}. Got {kind!r}.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidArgumentError(f"optimizer {kind!r} takes {sorted(known)}; got unknown {unknown}.")
    return cls(**{name: float(value) for name, value in fields.items()})
