"""A server lost for good (SIGKILL, SIGSTOP) without a launcher: every trainer names it within the reconnect window.

Each trainer waits UNISON_PS_RECONNECT_SECONDS (60 s, lowered here) from its first failed contact
with the server (a call, or a heartbeat), then its call fails with ServerUnavailableError naming
the server, its address and since when it has not answered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.ps._cluster import free_port, start_server, start_trainer, stop

RECONNECT = 3.0


def _wait_files(paths: list[Path], procs: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {[str(p) for p in paths if not p.exists()]}"
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
        time.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "fault"), [("async", signal.SIGKILL), ("async", signal.SIGSTOP),
                                             ("sync", signal.SIGKILL), ("sync", signal.SIGSTOP)],
                         ids=["async-sigkill", "async-sigstop", "sync-sigkill", "sync-sigstop"])
def test_every_trainer_names_the_lost_server_within_the_reconnect_window(tmp_path, mode: str, fault) -> None:
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    extra = {"UNISON_PS_RECONNECT_SECONDS": str(RECONNECT), "UNISON_PS_TRAINER_TIMEOUT_SECONDS": "30"}
    servers = [start_server(i, endpoints, 2, mode, **extra) for i in range(2)]
    outs = [tmp_path / f"t{t}.json" for t in range(2)]
    trainers = [start_trainer(t, endpoints, 2, mode, "sync_until_lost", outs[t], **extra) for t in range(2)]
    try:
        _wait_files([Path(f"{o}.ready") for o in outs], trainers + servers, 60)
        killed_at = time.time()
        os.kill(servers[1].pid, fault)
        assert [t.wait(RECONNECT + 30) for t in trainers] == [3, 3]
        for t, out in enumerate(outs):
            result = json.loads(out.read_text())
            assert result["type"] == "ServerUnavailableError", result
            pattern = (rf"parameter server 1 \({re.escape(endpoints[1])}\) has not answered trainer {t} since "
                       r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \((\d+\.\d) s, over the reconnect window of 3 s; last: "
                       r"(UNAVAILABLE|DEADLINE_EXCEEDED)")
            found = re.match(pattern, result["error"])
            assert found, result["error"]
            since = time.mktime(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S"))
            assert killed_at - 1.0 <= since <= killed_at + 5.0, (since, killed_at)  # noticed within a heartbeat or so
            assert RECONNECT <= float(found.group(2)) and result["at"] - killed_at <= RECONNECT + 5, result
    finally:
        if fault == signal.SIGSTOP:
            os.kill(servers[1].pid, signal.SIGCONT)
        stop(*trainers, *servers)
