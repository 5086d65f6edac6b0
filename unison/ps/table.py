"""A server's shard of a sparse table: int64 ids to rows, made on first use, up to a capacity.

A row's first value depends only on the table's initializer and the row's id (a counter-based hash,
not a random stream), so it is the same whichever server makes it, in whatever order, after any
restart, and a trainer can compute it locally (tests compare against a local reference that way).

Example:
    >>> shard = TableShard("emb", dim=2, capacity=10, initializer=Initializer("zeros"), optimizer=SGD(0.5))
    >>> shard.lookup(np.array([42, 7])).tolist()
    [[0.0, 0.0], [0.0, 0.0]]
    >>> shard.apply(np.array([42]), np.array([[1.0, 2.0]], np.float32))
    >>> shard.lookup(np.array([42])).tolist()
    [[-0.5, -1.0]]
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import InvalidArgumentError
from .errors import TableFullError
from .optim import Optimizer
from .plan import _mix

__all__ = ["INITIALIZERS", "Initializer", "TableShard"]

INITIALIZERS = ("zeros", "uniform", "normal")
_FIRST_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Initializer:
    """How a table's rows start: ``zeros``, ``uniform`` in [-scale, scale), or ``normal`` with std `scale`.

    Attributes:
        kind: one of `INITIALIZERS`.
        scale: the uniform bound or the normal standard deviation.
        seed: mixes into every row's values; tables with the same seed and kind start alike.
    """

    kind: str = "uniform"
    scale: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in INITIALIZERS:
            raise InvalidArgumentError(f"initializer must be one of {INITIALIZERS}. Got {self.kind!r}.")
        if not (math.isfinite(self.scale) and self.scale >= 0):
            raise InvalidArgumentError(f"initializer scale must be finite and >= 0. Got {self.scale!r}.")
        if not 0 <= self.seed < 2**63:
            raise InvalidArgumentError(f"initializer seed must be in [0, 2**63). Got {self.seed}.")

    def rows(self, ids: np.ndarray, dim: int) -> np.ndarray:
        """The first values of the rows of `ids` (float32, shape (len(ids), dim))."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.kind == "zeros" or not len(ids):
            return np.zeros((len(ids), dim), np.float32)
        with np.errstate(over="ignore"):
            base = _mix(ids ^ np.int64(self.seed)).astype(np.uint64)[:, None]
            counters = base * np.uint64(2 * dim + 1) + np.arange(2 * dim, dtype=np.uint64)[None, :]
        bits = _mix(counters.astype(np.int64)) >> np.uint64(11)
        uniform = bits.astype(np.float64) * (1.0 / 2**53)  # in [0, 1)
        if self.kind == "uniform":
            return ((uniform[:, :dim] * 2.0 - 1.0) * self.scale).astype(np.float32)
        # Box-Muller on two independent uniforms per element
        u1 = 1.0 - uniform[:, :dim]
        u2 = uniform[:, dim:]
        return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2) * self.scale).astype(np.float32)


class TableShard:
    """The rows of one sparse table that one server holds, with their optimizer state.

    Args:
        name: the table's name.
        dim: the width of every row.
        capacity: the most rows this shard holds.
        initializer: makes a row the first time its id is seen.
        optimizer: applies gradients to rows, keeping its state row by row.
        declared_capacity: the whole table's capacity as the trainers declared it (0: `capacity`), for
            messages and for checking that every trainer declared the same.
    """

    def __init__(self, name: str, dim: int, capacity: int, initializer: Initializer,
                 optimizer: Optimizer, declared_capacity: int = 0) -> None:
        self.name = name
        self.dim = dim
        self.capacity = capacity
        self.declared_capacity = declared_capacity or capacity
        self.initializer = initializer
        self.optimizer = optimizer
        self._slot_of: dict[int, int] = {}
        rows = min(capacity, _FIRST_ROWS)
        self.ids = np.zeros(rows, np.int64)
        self.values = np.zeros((rows, dim), np.float32)
        self.slots = optimizer.new_slots((rows, dim))
        self.steps = np.zeros(rows, np.int64)
        self.rows_made = 0

    def __repr__(self) -> str:
        return f"<TableShard {self.name!r} rows={len(self._slot_of)}/{self.capacity} dim={self.dim}>"

    def __len__(self) -> int:
        return len(self._slot_of)

    @property
    def nbytes(self) -> int:
        """Bytes held by values, optimizer state and the id index (the arrays' allocation)."""
        slots = sum(a.nbytes for a in self.slots.values())
        return self.values.nbytes + slots + self.steps.nbytes + self.ids.nbytes + 100 * len(self._slot_of)

    def _grow(self, needed: int) -> None:
        rows = len(self.values)
        if needed <= rows:
            return
        new_rows = min(self.capacity, max(needed, 2 * rows))

        def grown(a: np.ndarray) -> np.ndarray:
            b = np.zeros((new_rows,) + a.shape[1:], a.dtype)
            b[:rows] = a
            return b

        self.values, self.steps, self.ids = grown(self.values), grown(self.steps), grown(self.ids)
        self.slots = {name: grown(a) for name, a in self.slots.items()}

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """The row positions of unique `ids`, making the rows not seen before.

        Raises:
            TableFullError: the new ids do not fit in the capacity; nothing is made then.
        """
        slot_of = self._slot_of
        found = [slot_of.get(i, -1) for i in ids.tolist()]
        where = np.array(found, dtype=np.int64)
        fresh = np.flatnonzero(where < 0)
        if len(fresh):
            used = len(slot_of)
            if used + len(fresh) > self.capacity:
                raise TableFullError(
                    f"table {self.name!r} is full on this server: it holds {used} of its {self.capacity} "
                    f"rows and the batch brings {len(fresh)} new ids (the table was declared with capacity="
                    f"{self.declared_capacity}; this is this server's share). Declare a larger capacity.")
            self._grow(used + len(fresh))
            new_positions = np.arange(used, used + len(fresh), dtype=np.int64)
            new_ids = ids[fresh]
            self.ids[new_positions] = new_ids
            self.values[new_positions] = self.initializer.rows(new_ids, self.dim)
            for i, p in zip(new_ids.tolist(), new_positions.tolist()):
                slot_of[i] = p
            where[fresh] = new_positions
            self.rows_made += len(fresh)
        return where

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The current rows of unique `ids` (a copy), made on first use."""
        where = self.positions(np.asarray(ids, dtype=np.int64))  # first: it may grow the arrays
        return self.values[where]

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """Apply one gradient row per unique id with the table's optimizer."""
        where = self.positions(np.asarray(ids, dtype=np.int64))
        self.optimizer.apply(self.values, self.slots, self.steps, where, grads)

    def state(self) -> dict[str, np.ndarray]:
        """Copies of the used rows: ids, values, steps and every optimizer slot (for checkpoints)."""
        used = len(self._slot_of)
        out = {"ids": self.ids[:used].copy(), "values": self.values[:used].copy(),
               "steps": self.steps[:used].copy()}
        out.update({f"slot.{name}": a[:used].copy() for name, a in self.slots.items()})
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Replace the rows with a `state()` (from a checkpoint)."""
        ids = state["ids"]
        if len(ids) > self.capacity:
            raise InvalidArgumentError(
                f"the checkpoint of table {self.name!r} holds {len(ids)} rows, more than its capacity "
                f"{self.capacity}; declare the capacity it was saved with.")
        self._grow(len(ids))
        used = len(ids)
        self.ids[:used], self.values[:used], self.steps[:used] = ids, state["values"], state["steps"]
        for name in self.slots:
            self.slots[name][:used] = state[f"slot.{name}"]
        self._slot_of = {i: p for p, i in enumerate(ids.tolist())}
