"""A trainer lost for good (SIGKILL, SIGSTOP) without a launcher: what the others and the servers do.

The rule (docs/ps.md): in asynchronous mode the other trainers go on and finish, every server names
the lost trainer in its statistics, and the servers exit (status 3) once the others finished; in
synchronous mode the others' next pull fails with TrainerLostError naming it, and the servers exit
(status 3) once every other trainer was told, after writing their last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.ps._cluster import free_port, start_server, start_trainer, stop
from unison.ps import _checkpoint

TIMEOUT = "1.5"  # UNISON_PS_TRAINER_TIMEOUT_SECONDS: a trainer silent this long is lost


def _wait_files(paths: list[Path], procs: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {[str(p) for p in paths if not p.exists()]}"
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
        time.sleep(0.05)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_async_the_others_finish_and_the_servers_exit_naming_the_lost_trainer(tmp_path, fault) -> None:
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    extra = {"UNISON_PS_TRAINER_TIMEOUT_SECONDS": TIMEOUT}
    servers = [start_server(i, endpoints, 2, "async", **extra) for i in range(2)]
    outs = [tmp_path / f"t{t}.json" for t in range(2)]
    trainers = [start_trainer(t, endpoints, 2, "async", "async_outlive", outs[t], **extra) for t in range(2)]
    try:
        _wait_files([Path(f"{o}.ready") for o in outs], trainers + servers, 60)
        os.kill(trainers[1].pid, fault)
        time.sleep(0.5)
        Path(f"{outs[0]}.stop").write_text("")
        assert trainers[0].wait(40) == 0
        result = json.loads(outs[0].read_text())
        for stats in result["servers"]:
            assert list(stats["lost_trainers"]) == ["1"], stats["lost_trainers"]
            assert stats["trainers"]["1"]["lost"].startswith("trainer 1 (") and f"pid {trainers[1].pid}) sent " \
                "nothing for" in stats["trainers"]["1"]["lost"], stats["trainers"]
        assert [s.wait(20) for s in servers] == [3, 3]  # they exit by themselves: the others finished
    finally:
        stop(*trainers, *servers)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_sync_the_others_get_trainer_lost_and_the_servers_exit_after_their_checkpoint(tmp_path, fault) -> None:
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    ckpt = tmp_path / "ckpt"
    extra = {"UNISON_PS_TRAINER_TIMEOUT_SECONDS": TIMEOUT, "UNISON_PS_CHECKPOINT_DIR": str(ckpt)}
    servers = [start_server(i, endpoints, 3, "sync", **extra) for i in range(2)]
    outs = [tmp_path / f"t{t}.json" for t in range(3)]
    trainers = [start_trainer(t, endpoints, 3, "sync", "sync_until_lost", outs[t], **extra) for t in range(3)]
    try:
        _wait_files([Path(f"{o}.ready") for o in outs], trainers + servers, 60)
        os.kill(trainers[1].pid, fault)
        assert [trainers[t].wait(40) for t in (0, 2)] == [3, 3]
        for t in (0, 2):
            result = json.loads(outs[t].read_text())
            assert result["type"] == "TrainerLostError", result
            assert "trainer 1 (" in result["error"] and f"pid {trainers[1].pid}) pushed steps up to" in result[
                "error"] and "it died or is stopped" in result["error"], result
        assert [s.wait(20) for s in servers] == [3, 3]  # every other trainer was told: they exit
        steps = min(json.loads(outs[t].read_text())["steps"] for t in (0, 2))
        for i in range(2):  # the last checkpoint holds the steps every trainer completed
            found = _checkpoint.load(_checkpoint.checkpoint_path(str(ckpt), i, 2))
            assert found is not None and 3 <= found[0]["version"] <= steps + 1, (found and found[0], steps)
    finally:
        stop(*trainers, *servers)
