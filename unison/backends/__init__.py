"""Transports behind the `Backend` protocol (`base.py`), made by name through lazy factories.

A factory imports its transport's dependency only when that transport is selected, so a CPU job
never imports grpc and, later, a CPU machine never imports CUDA. `create_backend` is what `init()`
calls; a new transport (the GPU data plane, an elastic control plane) adds one `register_backend`
line here.

Example:
    >>> sorted(registered_backends())
    ['gloo', 'grpc', 'loopback', 'mpi']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import Settings
from .base import Backend

__all__ = ["BackendFactory", "create_backend", "register_backend", "registered_backends", "unregister_backend"]

# (communicator or None, settings, ranks on this host) -> a ready backend; collective over the comm.
# The communicator's type depends on the transport (an mpi4py Intracomm, a gloo.GlooWorld, None).
BackendFactory = Callable[[Any, Settings, int], Backend]
_FACTORIES: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make `create_backend(name, ...)` call `factory`; a second registration of a name replaces it."""
    _FACTORIES[name] = factory


def unregister_backend(name: str) -> None:
    """Forget the factory registered under `name` (nothing happens for an unknown name)."""
    _FACTORIES.pop(name, None)


def registered_backends() -> list[str]:
    """The names `create_backend` accepts."""
    return list(_FACTORIES)


def create_backend(name: str, comm: Any, settings: Settings, local_size: int = 1) -> Backend:
    """Make the backend called `name` over `comm` (None for a job of one process).

    Raises:
        ValueError: no backend has that name.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"No backend named {name!r}; registered: {sorted(_FACTORIES)}.")
    return factory(comm, settings, local_size)


def _mpi(comm: Any, settings: Settings, local_size: int) -> Backend:
    from .mpi import MpiBackend

    return MpiBackend(comm, settings.chunk_bytes, settings.hierarchical_allreduce,
                      settings.peer_timeout_seconds)


def _grpc(comm: Any, settings: Settings, local_size: int) -> Backend:
    from ..service.setup import grpc_backend

    backend: Backend = grpc_backend(comm, settings, local_size=local_size)
    return backend


def _gloo(comm: Any, settings: Settings, local_size: int) -> Backend:
    from .gloo import GlooBackend

    return GlooBackend(comm, settings.chunk_bytes)


def _loopback(comm: Any, settings: Settings, local_size: int) -> Backend:
    from .loopback import LoopbackBackend

    return LoopbackBackend()


register_backend("mpi", _mpi)
register_backend("grpc", _grpc)
register_backend("loopback", _loopback)
register_backend("gloo", _gloo)  # comm: a `gloo.GlooWorld` (a torch store, rank, size)
