"""The Backend contract (tests/backend_contract.py) on the gloo transport: torch's gloo groups made from a
torch store that rank 0 hosts, beside the job's own MPI or gRPC backend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import unison as hvd  # noqa: E402
from tests.backend_contract import check_all  # noqa: E402
from unison.backends import create_backend  # noqa: E402
from unison.backends.gloo import GlooWorld  # noqa: E402
from unison.config import load_settings  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_the_gloo_transport_keeps_the_contract() -> None:
    from datetime import timedelta

    from unison.adapters.torch.process_group import job_store

    store, rank, size = job_store(timedelta(seconds=60))
    backend = create_backend("gloo", GlooWorld(store, rank, size, 60.0), load_settings())
    try:
        assert (backend.rank, backend.size) == (hvd.rank(), hvd.size())
        check_all(backend)
    finally:
        backend.close()


def test_abandon_ends_a_wait_for_a_peer_that_never_comes() -> None:
    from datetime import timedelta

    from unison.adapters.torch.process_group import job_store
    from unison.backends.base import Abandoned

    store, rank, size = job_store(timedelta(seconds=60))
    backend = create_backend("gloo", GlooWorld(store, rank, size, 60.0), load_settings())
    import numpy as np

    try:
        if size > 1 and rank == 0:
            import threading

            threading.Timer(0.3, backend.abandon).start()
            with pytest.raises(Abandoned):
                backend.allgather_status(np.zeros(2, dtype=np.uint64))  # rank 1 never joins this one
    finally:
        hvd.barrier()
