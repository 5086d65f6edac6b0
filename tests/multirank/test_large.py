"""Tensors over 2 GiB (more elements or bytes than a 32-bit MPI count): opt-in, UNISON_TEST_LARGE=1."""

from __future__ import annotations

import os

import numpy as np
import pytest

import unison as hvd

GiB = 1024**3
PER_RANK_BYTES = 5 * GiB  # a rank's 2.1 GiB buffers and MPI's, with a margin (about 9 GiB at 2 ranks)


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


def _available_on_every_rank() -> tuple[int | None, int]:
    """The least `_available_bytes` of the ranks (None where no rank could tell) and the number of
    ranks, the same on every rank, so that they all run or all skip (collective)."""
    from mpi4py import MPI

    mine = _available_bytes()
    unknown = 2**62
    least = MPI.COMM_WORLD.allreduce(unknown if mine is None else mine, op=MPI.MIN)
    return (None if least == unknown else least), MPI.COMM_WORLD.Get_size()


_AVAILABLE, _RANKS = _available_on_every_rank() if os.environ.get("UNISON_TEST_LARGE") == "1" else (None, 1)
NEEDED_BYTES = PER_RANK_BYTES * _RANKS
pytestmark = [
    pytest.mark.skipif(os.environ.get("UNISON_TEST_LARGE") != "1",
                       reason="needs ~9 GiB of memory at 2 ranks; set UNISON_TEST_LARGE=1 (make test-large)"),
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
