"""Tensors over 2 GiB (more elements or bytes than a 32-bit MPI count): opt-in, UNISON_TEST_LARGE=1."""

from __future__ import annotations

import os

import numpy as np
import pytest

import unison as hvd

GiB = 1024**3
NEEDED_BYTES = 10 * GiB  # the ranks' buffers and MPI's, with a margin


def _available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (the whole machine's: the ranks share it), or None elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _available_on_every_rank() -> int | None:
    """The least `_available_bytes` of the ranks, so that they all run or all skip (collective)."""
    from mpi4py import MPI

    mine = _available_bytes()
    least = MPI.COMM_WORLD.allreduce(-1 if mine is None else mine, op=MPI.MIN)
    return None if least < 0 else least


_AVAILABLE = _available_on_every_rank() if os.environ.get("UNISON_TEST_LARGE") == "1" else None
pytestmark = [
    pytest.mark.skipif(os.environ.get("UNISON_TEST_LARGE") != "1",
                       reason="needs ~9 GiB of memory and a minute; set UNISON_TEST_LARGE=1 (make test-large)"),
    pytest.mark.skipif(_AVAILABLE is not None and _AVAILABLE < NEEDED_BYTES,
                       reason=f"needs {NEEDED_BYTES / GiB:.0f} GiB of available memory; this machine has "
                              f"{(_AVAILABLE or 0) / GiB:.1f} GiB"),
]


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_allreduce_over_2_gib_in_place() -> None:
    x = np.ones(int(2.1 * GiB) // 4, np.float32)  # 2.1 GiB, 563 M elements
    x[-1] = hvd.rank()
    hvd.allreduce_(x, op=hvd.Sum, name="big")
    assert x[0] == hvd.size() and x[-1] == sum(range(hvd.size()))
    assert (x[:-1] == hvd.size()).all()


def test_broadcast_over_2_gib_of_bytes() -> None:
    x = np.full(int(2.1 * GiB), hvd.rank(), np.uint8)  # 2.1 G elements: over a 32-bit count
    hvd.broadcast_(x, root_rank=hvd.size() - 1, name="bigb")
    assert x[0] == hvd.size() - 1 and x[-1] == hvd.size() - 1
