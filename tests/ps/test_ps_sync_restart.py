"""Synchronous training across a server's restart: it goes on when the checkpoint is of the trainers' step, else stops loudly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.ps._cluster import SECRET, free_port, start_server, start_trainer, stop, wait_all
from unison.ps import Client


def _wait_files(paths: list[Path], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("checkpoint_at", "restart_at"), [(3, 3), (2, 4)])
def test_sync_training_resumes_only_at_the_checkpoint_step(tmp_path, checkpoint_at: int, restart_at: int) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    extra = {"UNISON_PS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "UNISON_PS_CHECKPOINT_SECONDS": "0",
             "PAUSES": f"{checkpoint_at},{restart_at}", "STEPS": "6"}
    server = start_server(0, [endpoint], 2, "sync", **extra)
    outs = [tmp_path / f"t{t}.json" for t in range(2)]
    trainers = [start_trainer(t, [endpoint], 2, "sync", "sync_pauses", outs[t], **extra) for t in range(2)]
    observer = Client([endpoint], SECRET, trainer=0, num_trainers=2, mode="sync", reconnect_seconds=30.0,
                      heartbeat_seconds=0)

    def pause(step: int) -> None:  # both trainers pulled `step` and wait before pushing it
        _wait_files([Path(f"{o}.ready-{step}") for o in outs], 60)

    def go(step: int) -> None:
        for o in outs:
            Path(f"{o}.go-{step}").write_text("")

    try:
        pause(checkpoint_at)
        observer.checkpoint()  # every trainer has pushed steps below checkpoint_at, and none of it
        assert observer.server_statistics()[0]["version"] == checkpoint_at
        if restart_at != checkpoint_at:
            go(checkpoint_at)
            pause(restart_at)
        stop(server)  # SIGKILL: what was applied after the checkpoint is lost
        server = start_server(0, [endpoint], 2, "sync", **extra)
        go(restart_at)
        codes = wait_all(trainers, 60)
        results = [json.loads(o.read_text()) for o in outs]
        if checkpoint_at == restart_at:  # nothing was lost: the steps go on as if the server never stopped
            assert codes == [0, 0], results
            for result in results:
                np.testing.assert_allclose(result["w"], np.full(4, -0.6), rtol=1e-6)  # 6 steps of 0.1, each once
            assert server.wait(20) == 0
        else:
            assert codes == [3, 3], results
            for t, result in enumerate(results):
                assert (f"parameter server 0 restarted from its checkpoint at step {checkpoint_at}, but trainer {t} "
                        f"is at step {restart_at}: steps {checkpoint_at} to {restart_at - 1} of this server are "
                        "lost") in result["error"], result
            stats = observer.server_statistics()[0]
            assert (stats["restored"], stats["version"], stats["pushes"]) == (True, checkpoint_at, 0)
            assert stats["refused_requests"] >= 2
    finally:
        observer.close()
        stop(*trainers, server)
