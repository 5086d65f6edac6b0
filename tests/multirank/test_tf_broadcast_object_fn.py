"""unison.tensorflow.broadcast_object_fn: a one-argument broadcast with its arguments fixed, as in Horovod."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

pytest.importorskip("tensorflow")

import unison.tensorflow as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def test_broadcast_object_fn_shares_the_roots_object() -> None:
    root = hvd.size() - 1
    share = hvd.broadcast_object_fn(root_rank=root, name="config")
    assert share({"rank": hvd.rank()}) == {"rank": root}
    assert hvd.broadcast_object_fn()(["from", hvd.rank()]) == ["from", 0]
