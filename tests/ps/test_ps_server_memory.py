"""A parameter server's memory in its status: what its tables hold, and its process's resident memory."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ps._cluster import SECRET, free_port, start_server, stop
from unison.ps import Adam, Client


@pytest.mark.timeout(60)
def test_server_status_reports_memory_that_follows_the_rows_held() -> None:
    endpoints = [f"127.0.0.1:{free_port()}"]
    server = start_server(0, endpoints, 1, "async")
    client = Client(endpoints, SECRET, trainer=0, num_trainers=1, heartbeat_seconds=0)
    try:
        client.connect()
        client.declare_table("big", dim=64, capacity=1_000_000, optimizer=Adam(0.01))
        empty = client.server_statistics()[0]
        ids = np.arange(60_000, dtype=np.int64) * 7
        client.pull_sparse("big", ids)
        client.push(sparse={"big": (ids, np.ones((len(ids), 64), np.float32))})  # Adam's slots get written
        held = client.server_statistics()[0]
        assert held["tables"]["big"]["rows"] == len(ids)
        per_row = 3 * 64 * 4  # values and Adam's two moments, float32
        grown = held["memory_bytes"] - empty["memory_bytes"]
        assert len(ids) * per_row <= grown <= 3 * len(ids) * per_row, (grown, len(ids) * per_row)  # doubling
        assert held["rss_bytes"] >= held["memory_bytes"] > 0  # the process holds them resident
        assert held["rss_bytes"] - empty["rss_bytes"] >= 0.8 * len(ids) * per_row, (held["rss_bytes"],
                                                                                       empty["rss_bytes"])
        client.finish()
        assert server.wait(20) == 0
    finally:
        client.close()
        stop(server)
