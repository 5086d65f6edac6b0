"""Tensors over 2 GiB (more elements or bytes than a 32-bit MPI count): opt-in, UNISON_TEST_LARGE=1."""

from __future__ import annotations

import os

import numpy as np
import pytest

import unison as hvd

pytestmark = pytest.mark.skipif(os.environ.get("UNISON_TEST_LARGE") != "1",
                                reason="needs ~9 GiB of memory and a minute; set UNISON_TEST_LARGE=1 (make test-large)")
GiB = 1024**3


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
