"""A parameter server and its trainers in one process: bad input gets a clear error and the server keeps serving."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from unison.errors import ConfigError
from unison.ps import (
    SGD,
    Adam,
    Client,
    Initializer,
    ParameterServer,
    RequestError,
    TableFullError,
    _checkpoint,
)
from unison.ps import ps_pb2 as pb
from unison.ps._methods import PARAMETER_SERVER

SECRET = "p" * 64


@pytest.fixture
def server():
    srv = ParameterServer(0, 1, 2, SECRET, mode="async")
    srv.start()
    yield srv
    srv.stop(grace_seconds=0.1)


def _client(server, trainer=0, **kwargs) -> Client:
    client = Client([server.address], kwargs.pop("secret", SECRET), trainer=trainer, num_trainers=2,
                    reconnect_seconds=5.0, heartbeat_seconds=0, **kwargs)
    client.connect()
    return client


@pytest.mark.timeout(30)
def test_bad_input_is_refused_clearly_and_the_server_keeps_serving(server) -> None:
    client = _client(server)
    client.declare_table("emb", dim=4, capacity=3, initializer=Initializer("zeros"))
    client.declare_dense({"w": np.ones(5, np.float32)}, SGD(0.1))
    with pytest.raises(RequestError, match=r"refused Pull from trainer 0: unknown table 'nope' on parameter server 0; declared tables: \['emb'\]"):
        client._tables["nope"] = client._tables["emb"]  # as if declared here but not on the server
        client.pull_sparse("nope", np.array([1]))
    with pytest.raises(TableFullError, match=r"table 'emb' is full on this server: it holds 0 of its 3 rows and the batch brings 4 new ids"):
        client.pull_sparse("emb", np.array([10, 11, 12, 13]))
    client._tables["emb"] = type(client._tables["emb"])(dim=3, capacity=3)  # a trainer with the wrong width
    with pytest.raises(RequestError, match=r"gradient of table 'emb' carries 3 values per row for 2 ids; the table's rows have dim=4"):
        client.push(sparse={"emb": (np.array([1, 2]), np.ones((2, 3)))})
    client._tables["emb"] = type(client._tables["emb"])(dim=4, capacity=3)
    with pytest.raises(RequestError, match=r"gradient of 'w#0' holds NaN or infinity; nothing of this push was applied"):
        client.push(dense={"w": np.array([1, np.nan, 0, 0, 0])})
    with pytest.raises(RequestError, match=r"table 'emb' was declared differently before; dim: 4 here, 8 from trainer 0"):
        client.declare_table("emb", dim=8, capacity=3, initializer=Initializer("zeros"))
    with pytest.raises(RequestError, match=r"the gradient of .w. has shape \(2,\); the parameter was declared with shape \(5,\)"):
        client.push(dense={"w": np.ones(2)})
    # still serving: a good pull and push go through
    client.push(dense={"w": np.ones(5)}, sparse={"emb": (np.array([7, 7]), np.ones((2, 4)))})
    values, rows = client.pull(["w"], {"emb": np.array([7])})
    np.testing.assert_allclose(values["w"], 0.9)
    np.testing.assert_allclose(rows["emb"], -0.02)
    assert server.statistics()["refused_requests"] == 5
    client.close()


@pytest.mark.timeout(30)
def test_calls_without_the_secret_or_with_bad_fields_are_refused(server) -> None:
    with pytest.raises(ConfigError, match=r"refused trainer 0: missing or wrong job secret"):
        _client(server, secret="q" * 64)
    channel = grpc.insecure_channel(server.address)
    call = channel.stream_unary(PARAMETER_SERVER.path("Hello"))
    with pytest.raises(grpc.RpcError) as caught:
        call(iter([pb.TrainerInfo(trainer=9, num_trainers=2).SerializeToString()]),
             metadata=(("x-unison-token", SECRET),))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "trainer must be in range(num_trainers=2). Got trainer=9." in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        call(iter([b"\xff\xff\xff"]), metadata=(("x-unison-token", SECRET),))
    assert "message 0 (3 bytes) is not a valid TrainerInfo" in caught.value.details()
    declare = channel.stream_unary(PARAMETER_SERVER.path("Declare"))
    bad = pb.Frame(trainer=0, optimizer=pb.Optimizer(kind="sgd"), tables=[pb.TableDecl(name="t", dim=0, capacity=5,
                                                                                      initializer="zeros")])
    with pytest.raises(grpc.RpcError, match=r"table 't': dim must be in \[1, 65536\]. Got dim=0"):
        declare(iter([bad.SerializeToString()]), metadata=(("x-unison-token", SECRET),))
    channel.close()
    assert server.statistics()["refused"] == 1  # the call without the secret, refused by the gate


@pytest.mark.timeout(30)
def test_a_mode_mismatch_is_refused(server) -> None:
    with pytest.raises(RequestError, match=r"trainer 1 trains in 'sync' mode; parameter server 0 runs in 'async' mode"):
        _client(server, trainer=1, mode="sync")


@pytest.mark.timeout(30)
def test_sync_steps_average_every_trainer_and_async_counts_staleness() -> None:
    srv = ParameterServer(0, 1, 2, SECRET, mode="sync")
    srv.start()
    results = {}

    def train(trainer: int) -> None:
        client = Client([srv.address], SECRET, trainer=trainer, num_trainers=2, mode="sync", heartbeat_seconds=0)
        client.connect()
        client.declare_dense({"w": np.zeros(3, np.float32)}, Adam(0.1))
        for step in range(3):
            client.pull_dense()
            client.push(dense={"w": np.full(3, trainer + step, np.float32)})
        results[trainer] = client.pull_dense()["w"]
        client.finish()

    threads = [threading.Thread(target=train, args=(t,)) for t in range(2)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert srv.wait_finished(5)
    reference = Adam(0.1)
    values = np.zeros((1, 3), np.float32)
    slots, steps = reference.new_slots(values.shape), np.zeros(1, np.int64)
    for step in range(3):
        reference.apply(values, slots, steps, np.array([0]), np.full((1, 3), (0 + step + 1 + step) / 2, np.float32))
    np.testing.assert_allclose(results[0], values[0], rtol=1e-6)
    np.testing.assert_array_equal(results[0], results[1])
    assert srv.statistics()["version"] == 3
    srv.stop(0.1)

    srv = ParameterServer(0, 1, 2, SECRET, mode="async")
    srv.start()
    a, b = (Client([srv.address], SECRET, trainer=t, num_trainers=2, heartbeat_seconds=0) for t in (0, 1))
    for c in (a, b):
        c.connect()
        c.declare_dense({"w": np.zeros(2, np.float32)}, SGD(1.0))
        c.pull_dense()
    a.push(dense={"w": np.ones(2)})
    b.push(dense={"w": np.ones(2)})  # computed from version 0; one update came in between
    stats = srv.statistics()
    assert (stats["staleness_max"], stats["staleness_histogram"]) == (1, {"0": 1, "1": 1})
    np.testing.assert_allclose(a.pull_dense()["w"], -2.0)
    a.close(), b.close()
    srv.stop(0.1)


@pytest.mark.timeout(30)
def test_a_sync_push_sent_again_is_taken_once_and_the_checkpoint_keeps_applied_numbers(tmp_path) -> None:
    srv = ParameterServer(0, 1, 2, SECRET, mode="sync", checkpoint_dir=str(tmp_path))
    srv.start()
    a, b = (Client([srv.address], SECRET, trainer=t, num_trainers=2, mode="sync", heartbeat_seconds=0) for t in (0, 1))
    for c in (a, b):
        c.connect()
        c.declare_dense({"w": np.zeros(2, np.float32)}, SGD(1.0))
    a.push(dense={"w": np.ones(2)})
    b.push(dense={"w": np.ones(2)})  # step 0 applied
    a.push(dense={"w": np.full(2, 2.0)})  # step 1 waits for b
    a._sequences[0], a.step = 1, 1  # a's push of step 1 once more (its pending sum must not double)
    a.push(dense={"w": np.full(2, 2.0)})
    a._sequences[0], a.step = 0, 0  # and its push of step 0, which was applied
    a.push(dense={"w": np.ones(2)})
    a._sequences[0], a.step = 2, 2
    assert srv.statistics()["duplicate_pushes"] == 2 and a.statistics()["pushes_taken_before"] == 2
    path = srv.checkpoint()
    assert _checkpoint.load(Path(path))[0]["sequences"] == {"0": 1, "1": 1}  # step 1 is not applied
    b.push(dense={"w": np.full(2, 2.0)})  # step 1 applied: the average of 2 and 2, once
    np.testing.assert_array_equal(a.pull_dense()["w"], np.full(2, -3.0))
    assert _checkpoint.load(Path(srv.checkpoint()))[0]["sequences"] == {"0": 2, "1": 2}
    a.close(), b.close()
    srv.stop(0.1)


@pytest.mark.timeout(30)
def test_a_server_at_another_place_in_the_endpoints_is_refused_by_name() -> None:
    servers = [ParameterServer(index, 2, 1, SECRET, mode="async") for index in (0, 1)]
    for srv in servers:
        srv.start()
    try:
        first, second = (srv.address for srv in servers)
        for endpoints, at, says, listed in (([second, first], second, 1, 0),  # swapped: each gets the other's state
                                            ([second], second, 1, 0)):  # past the end of the trainer's list
            client = Client(endpoints, SECRET, trainer=0, num_trainers=1, reconnect_seconds=5.0, heartbeat_seconds=0)
            with pytest.raises(ConfigError, match=(
                    rf"^The parameter server at {at} is server {says} of 2 \(its UNISON_PS_SERVER_INDEX\), but "
                    rf"trainer 0's UNISON_PS_ENDPOINTS lists it as server {listed} of {len(endpoints)}\. Give every "
                    r"server the index of its place in UNISON_PS_ENDPOINTS, and every process the same list\.$")):
                client.connect()
            assert client.state.value == "created"
            client.close()
        client = Client([first, second], SECRET, trainer=0, num_trainers=1, reconnect_seconds=5.0, heartbeat_seconds=0)
        assert [reply.server for reply in client.connect()] == [0, 1]  # in their places: connected
        client.close()
    finally:
        for srv in servers:
            srv.stop(grace_seconds=0.1)
