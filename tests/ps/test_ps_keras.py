"""The Keras layer on a real server: model.fit trains only the rows it saw, as keras.layers.Embedding would."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ps._cluster import run_job
from unison.ps import Initializer


@pytest.mark.timeout(120)
@pytest.mark.parametrize("eager", ["0", "1"], ids=["graph", "eager"])
def test_keras_fit_equals_a_local_embedding_and_touches_only_seen_rows(tmp_path, eager: str) -> None:
    pytest.importorskip("keras")
    [out] = run_job(tmp_path, "keras_sync", "sync", trainers=1, servers=1, timeout=100, KERAS_EAGER=eager)
    got = np.load(out)
    start = Initializer("uniform", 0.5, seed=3).rows(np.arange(64), 8)
    changed = np.flatnonzero(np.any(got["rows"] != start, axis=1))
    np.testing.assert_array_equal(changed, got["seen"])  # every seen row moved, no other did
    assert got["stats"][0] == 8  # one push per step: 64 samples / 16, two epochs
    np.testing.assert_allclose(got["rows"], got["ref0"], rtol=1e-5, atol=1e-5)
    for i in range(1, 5):
        np.testing.assert_allclose(got[f"w{i}"], got[f"ref{i}"], rtol=1e-5, atol=1e-5)
    assert got["loss"][-1] < got["loss"][0]


@pytest.mark.timeout(120)
def test_mask_zero_masks_padding_as_keras_embedding_does(tmp_path) -> None:
    pytest.importorskip("keras")
    [out] = run_job(tmp_path, "keras_mask", "sync", trainers=1, servers=1, timeout=100)
    got = np.load(out)
    np.testing.assert_array_equal(got["mask"], got["ids"] != 0)
    assert got["config"][0]
    np.testing.assert_allclose(got["rows"], got["ref_True_rows"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["pred"], got["ref_True_pred"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["rows"][0], got["start"][0])  # padding's row gets no gradient
    assert not np.allclose(got["pred"], got["ref_False_pred"], atol=1e-3)  # without the mask it differs
