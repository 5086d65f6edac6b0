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


def test_close_waits_for_a_heartbeat_inside_the_store() -> None:
    """A daemon thread inside torch's C++ when the interpreter finalizes aborts the process (SIGABRT,
    "terminate called without an active exception"): close() lets the heartbeat's store call end first."""
    import dataclasses
    import threading
    from datetime import timedelta

    from unison.adapters.torch.process_group import job_store

    store, rank, size = job_store(timedelta(seconds=60))
    if size < 2:
        pytest.skip("a heartbeat beats only with peers")
    world = GlooWorld(store, rank, size, 60.0, peer_timeout_seconds=30.0)
    backend = create_backend("gloo", world, load_settings())
    entered = threading.Event()

    class SlowStore:  # the heartbeat's add blocks in torch's C++ (a wait for a key nobody sets) for 1 s
        def add(self, key: str, value: int) -> int:
            if value:
                entered.set()
                store.wait([f"unison.test.never.{rank}"], timedelta(seconds=1))
            return store.add(key, value)

    try:
        backend._world = dataclasses.replace(world, store=SlowStore())
        assert entered.wait(10), "the heartbeat never beat"
    finally:
        backend.close()
    assert not backend._beating.is_alive()
    hvd.barrier()


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) listening on `port`."""
    from pathlib import Path

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_a_single_host_job_store_listens_on_loopback_alone() -> None:
    from datetime import timedelta
    from pathlib import Path

    from unison.adapters.torch.process_group import job_store

    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux's /proc/net/tcp to see which addresses listen")
    if hvd.local_size() != hvd.size():
        pytest.skip("the job spans hosts: the store must listen where the other hosts reach it")
    store, rank, size = job_store(timedelta(seconds=60))
    if size == 1:
        assert type(store).__name__ == "HashStore"
        return
    store.set(f"rank{rank}", str(rank))  # the store serves every rank
    assert [store.get(f"rank{r}").decode() for r in range(size)] == [str(r) for r in range(size)]
    if rank == 0:
        assert _listening(store.port) == {"0100007F"}  # 127.0.0.1, and nothing else
    hvd.barrier()
