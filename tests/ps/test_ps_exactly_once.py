"""A push whose reply is lost is sent again and applied once, also across a server's restart from its checkpoint."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.ps._cluster import SECRET, free_port, start_server, stop
from tests.ps._proxy import Relay
from unison.ps import SGD, Client


def _until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_push_sent_again_after_its_reply_was_lost_is_applied_once(tmp_path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    extra = {"UNISON_PS_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    server = start_server(0, [endpoint], 1, "async", **extra)
    relay = Relay(endpoint)
    trainer = Client([relay.address], SECRET, trainer=0, num_trainers=1, reconnect_seconds=30.0, heartbeat_seconds=0)
    observer = Client([endpoint], SECRET, trainer=0, num_trainers=1, reconnect_seconds=30.0, heartbeat_seconds=0)
    try:
        trainer.connect()
        trainer.declare_dense({"w": np.zeros(4, np.float32)}, SGD(1.0))
        trainer.push(dense={"w": np.ones(4)})

        relay.hold_replies()  # the next push reaches the server, its reply does not reach the trainer
        failures: list[BaseException] = []

        def push() -> None:
            try:
                trainer.push(dense={"w": np.full(4, 2.0)})
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                failures.append(exc)

        pushing = threading.Thread(target=push)
        pushing.start()
        _until(lambda: observer.server_statistics()[0]["pushes"] == 2, 30, "the server to apply the second push")
        assert pushing.is_alive()  # still waiting for the withheld reply
        relay.cut()
        pushing.join(30)
        assert not pushing.is_alive() and not failures, failures
        assert relay.withheld_bytes > 0
        stats = observer.server_statistics()[0]
        assert (stats["pushes"], stats["duplicate_pushes"], stats["version"]) == (2, 1, 2)
        assert trainer.statistics()["retries"] >= 1
        assert trainer.statistics()["pushes_taken_before"] == 1
        np.testing.assert_array_equal(trainer.pull_dense()["w"], np.full(4, -3.0))  # 1 + 2, each once

        # the last push number taken is in the checkpoint: after a restart, a resend is still not applied
        observer.checkpoint()
        stop(server)
        server = start_server(0, [endpoint], 1, "async", **extra)
        fresh = Client([endpoint], SECRET, trainer=0, num_trainers=1, reconnect_seconds=30.0, heartbeat_seconds=0)
        assert [r.sequence for r in fresh.connect()] == [2]  # a restarted trainer numbers on from here
        fresh.close()
        trainer._sequences[0] -= 1  # as if the second push were sent once more
        trainer.push(dense={"w": np.full(4, 2.0)})
        stats = observer.server_statistics()[0]
        assert (stats["restored"], stats["pushes"], stats["duplicate_pushes"]) == (True, 0, 1)
        np.testing.assert_array_equal(trainer.pull_dense()["w"], np.full(4, -3.0))
        trainer.push(dense={"w": np.full(4, 4.0)})  # the next number is applied
        np.testing.assert_array_equal(trainer.pull_dense()["w"], np.full(4, -7.0))
        trainer.finish()
        assert server.wait(20) == 0
    finally:
        observer.close()
        trainer.close()
        relay.close()
        stop(server)
