"""Table shards: rows made on first use, deterministic initializers, capacity, state round trip."""

from __future__ import annotations

import numpy as np
import pytest

from unison.errors import InvalidArgumentError
from unison.ps.errors import TableFullError
from unison.ps.optim import SGD, Adagrad
from unison.ps.table import Initializer, TableShard


def test_initial_rows_depend_only_on_seed_and_id() -> None:
    init = Initializer("uniform", 0.5, seed=7)
    a = init.rows(np.array([3, 10**12, -4]), 16)
    b = init.rows(np.array([-4, 3]), 16)
    np.testing.assert_array_equal(a[[2, 0]], b)
    assert np.abs(a).max() <= 0.5 and a.std() > 0.1
    assert not np.array_equal(a, Initializer("uniform", 0.5, seed=8).rows(np.array([3, 10**12, -4]), 16))
    normal = Initializer("normal", 2.0).rows(np.arange(2000), 32)
    assert abs(normal.mean()) < 0.05 and abs(normal.std() - 2.0) < 0.05


def test_bad_initializers_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"initializer must be one of \('zeros', 'uniform', 'normal'\). Got 'ones'"):
        Initializer("ones")
    with pytest.raises(InvalidArgumentError, match=r"scale must be finite and >= 0. Got -1"):
        Initializer("normal", -1)


def test_rows_are_made_once_and_updated_in_place() -> None:
    table = TableShard("t", 4, 5000, Initializer("uniform", 0.1), SGD(1.0))
    ids = np.arange(3000, dtype=np.int64) * 7919  # grows past the first allocation
    first = table.lookup(ids)
    np.testing.assert_array_equal(first, Initializer("uniform", 0.1).rows(ids, 4))
    table.apply(ids[:2], np.ones((2, 4), np.float32))
    np.testing.assert_allclose(table.lookup(ids[:3]), first[:3] - np.array([[1], [1], [0]]), rtol=1e-6)
    assert len(table) == 3000 and table.rows_made == 3000


def test_a_full_table_refuses_the_batch_and_makes_nothing() -> None:
    table = TableShard("t", 2, 4, Initializer("zeros"), SGD())
    table.lookup(np.array([1, 2, 3]))
    with pytest.raises(TableFullError, match=r"table 't' is full on this server: it holds 3 of its 4 rows and the batch brings 2 new ids"):
        table.lookup(np.array([1, 8, 9]))
    assert len(table) == 3
    table.lookup(np.array([9]))
    assert len(table) == 4


def test_state_round_trips_with_optimizer_slots() -> None:
    table = TableShard("t", 3, 100, Initializer("normal", 1.0), Adagrad(0.1))
    table.apply(np.array([4, 9]), np.ones((2, 3), np.float32))
    copy = TableShard("t", 3, 100, Initializer("normal", 1.0), Adagrad(0.1))
    copy.restore(table.state())
    for t in (table, copy):
        t.apply(np.array([9, 11]), np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(copy.lookup(np.array([4, 9, 11])), table.lookup(np.array([4, 9, 11])))
