"""The Backend contract (tests/backend_contract.py) on the job's own transport: MPI, or gRPC with UNISON_CONTROLLER=grpc.

Each test makes a second backend of the configured kind over the job's ranks, beside the engine's
own, and runs the contract on it (the engine keeps its backend to itself).
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

import unison as hvd
from tests.backend_contract import check_all
from unison.backends import create_backend
from unison.config import load_settings


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_the_configured_transport_keeps_the_contract() -> None:
    settings = load_settings()
    backend = create_backend(settings.controller, MPI.COMM_WORLD, settings, local_size=hvd.local_size())
    try:
        assert (backend.rank, backend.size) == (hvd.rank(), hvd.size())
        check_all(backend)
    finally:
        backend.close()
