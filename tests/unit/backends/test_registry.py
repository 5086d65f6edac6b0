"""Backends are made by name through lazy factories; unknown names are refused with the list."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from unison.backends import create_backend, register_backend, registered_backends, unregister_backend
from unison.backends.loopback import LoopbackBackend
from unison.config import load_settings
from unison.ops import ReduceOp


def test_every_control_plane_setting_has_a_backend() -> None:
    assert {"mpi", "grpc"} <= set(registered_backends())
    assert "loopback" in registered_backends()


def test_loopback_is_made_by_name_and_works() -> None:
    backend = create_backend("loopback", None, load_settings({}))
    assert isinstance(backend, LoopbackBackend) and (backend.rank, backend.size) == (0, 1)
    buf = np.arange(4.0)
    backend.allreduce_(buf, ReduceOp.SUM, 0)
    np.testing.assert_array_equal(buf, np.arange(4.0))


def test_unknown_name_is_refused_with_the_registered_names() -> None:
    with pytest.raises(ValueError, match=r"No backend named 'nccl'; registered: \['gloo', 'grpc', 'loopback', 'mpi'\]"):
        create_backend("nccl", None, load_settings({}))


def test_a_registered_factory_is_called_with_comm_settings_and_local_size() -> None:
    seen = []

    def factory(comm, settings, local_size):  # type: ignore[no-untyped-def]
        seen.append((comm, settings.chunk_bytes, local_size))
        return LoopbackBackend()

    register_backend("recording", factory)
    try:
        create_backend("recording", "the-comm", load_settings({"UNISON_CHUNK_BYTES": "7"}), local_size=3)
    finally:
        unregister_backend("recording")
    assert "recording" not in registered_backends()
    assert seen == [("the-comm", 7, 3)]


def test_factories_import_their_dependencies_only_when_selected() -> None:
    code = ("import sys, unison, unison.backends; "
            "print(sorted(m for m in ('grpc', 'mpi4py', 'unison.service') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
