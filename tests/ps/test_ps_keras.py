"""The Keras layer on a real server: model.fit trains only the rows it saw, as keras.layers.Embedding would."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ps._cluster import free_port, start_server, start_trainer, stop, wait_all
from unison.ps import Initializer


@pytest.mark.timeout(120)
@pytest.mark.parametrize("eager", ["0", "1"], ids=["graph", "eager"])
def test_keras_fit_equals_a_local_embedding_and_touches_only_seen_rows(tmp_path, eager: str) -> None:
    pytest.importorskip("keras")
    endpoints = [f"127.0.0.1:{free_port()}"]
    server = start_server(0, endpoints, 1, "sync")
    trainer = start_trainer(0, endpoints, 1, "sync", "keras_sync", tmp_path / "t0.npz", KERAS_EAGER=eager)
    try:
        assert wait_all([trainer], 100) == [0]
        assert wait_all([server], 20) == [0]
    finally:
        stop(trainer, server)
    got = np.load(tmp_path / "t0.npz")
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
    endpoints = [f"127.0.0.1:{free_port()}"]
    server = start_server(0, endpoints, 1, "sync")
    trainer = start_trainer(0, endpoints, 1, "sync", "keras_mask", tmp_path / "t0.npz")
    try:
        assert wait_all([trainer], 100) == [0]
        assert wait_all([server], 20) == [0]
    finally:
        stop(trainer, server)
    got = np.load(tmp_path / "t0.npz")
    np.testing.assert_array_equal(got["mask"], got["ids"] != 0)
    assert got["config"][0]
    np.testing.assert_allclose(got["rows"], got["ref_True_rows"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["pred"], got["ref_True_pred"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["rows"][0], got["start"][0])  # padding's row gets no gradient
    assert not np.allclose(got["pred"], got["ref_False_pred"], atol=1e-3)  # without the mask it differs
