"""torch's join(device): Horovod's signature, on every rank, whatever the device argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import unison.torch as hvd  # noqa: E402
from unison.errors import InvalidArgumentError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_join_takes_a_device_and_returns_the_last_rank() -> None:
    # Horovod's examples pass the GPU index; ranks may pass different devices.
    for device in (hvd.local_rank(), -1):
        last = hvd.join(device)
        assert type(last) is int and 0 <= last < hvd.size()
        assert hvd.allgather_object(last) == [last] * hvd.size()
    assert isinstance(hvd.join(device=-1), int)


def test_join_refuses_a_bad_device_on_the_calling_rank() -> None:
    for bad in (-2, "cuda:0", 1.0, True):
        with pytest.raises(InvalidArgumentError, match=r"join\(device\) takes -1 \(the CPU\) or a GPU "
                           rf"index >= 0, such as hvd.local_rank\(\). Got device={bad!r}\."):
            hvd.join(bad)
    hvd.barrier()
