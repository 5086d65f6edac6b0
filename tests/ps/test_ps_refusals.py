"""Wrong ids, shapes and capacities against a real server process: refused on the trainer, naming what was passed.

Each refusal must leave the server untouched: nothing is sent, so its pulls, pushes and rows stay as
they were.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.ps._cluster import SECRET, free_port, start_server, stop
from unison.ps import SGD, Client, Initializer, RequestError


@pytest.fixture
def servers():
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = [start_server(i, endpoints, 2, "async") for i in range(2)]
    yield endpoints
    stop(*procs)


def _client(endpoints: list[str], trainer: int = 0) -> Client:
    client = Client(endpoints, SECRET, trainer=trainer, num_trainers=2, reconnect_seconds=20.0, heartbeat_seconds=0)
    client.connect()
    return client


def _served(client: Client) -> list[tuple[int, int, int, int]]:
    """What each server did: pulls, pushes, table rows, rows pulled."""
    return [(s["pulls"], s["pushes"], sum(t["rows"] for t in s["tables"].values()), s["rows_pulled"])
            for s in client.server_statistics()]


@pytest.mark.timeout(60)
def test_ids_that_are_not_int64_integers_are_refused_naming_the_table_dtype_and_a_value(servers) -> None:
    client = _client(servers)
    try:
        client.declare_table("clicks", dim=4, capacity=1000, initializer=Initializer("uniform", 0.5, seed=1),
                             optimizer=SGD(0.1))
        client.pull_sparse("clicks", np.array([1, 2]))
        before = _served(client)
        refused = [
            (np.array([1.7, 2.0]), r"dtype float64, for example 1\.7\. Pass integer ids"),
            (np.array([3.0, np.nan]), r"dtype float64, for example nan\."),
            (np.array([2**64 - 1], np.uint64), r"dtype uint64, for example 18446744073709551615 \(over 2\*\*63 - 1"),
            ([2**64 - 1], r"dtype uint64, for example 18446744073709551615"),
            ([2**70, 1], r"dtype object \(int values\), for example 1180591620717411303424 \(outside int64\)"),
            (np.array(["7"]), r"dtype <U1, for example '7'"),
            (np.array([True, False]), r"dtype bool, for example True"),
        ]
        for ids, detail in refused:
            prefix = r"ids of table 'clicks' must be integers \(any int64 value\); nothing was sent\. Got "
            with pytest.raises(RequestError, match=prefix + detail):
                client.pull_sparse("clicks", ids)
            with pytest.raises(RequestError, match=prefix + detail):
                client.pull(sparse={"clicks": ids})
            with pytest.raises(RequestError, match=prefix + detail):
                client.push(sparse={"clicks": (ids, np.ones((np.size(ids), 4)))})
        assert _served(client) == before  # nothing reached a server
        # every integer dtype whose values fit in int64 reads the same rows as int64
        expected = client.pull_sparse("clicks", np.array([5, 2**40, -3, 2**63 - 1]))
        np.testing.assert_array_equal(client.pull_sparse("clicks", np.array([5, 2**40, -3, 2**63 - 1], np.int64)),
                                      expected)
        np.testing.assert_array_equal(client.pull_sparse("clicks", np.array([5, 2**40, 2**63 - 1], np.uint64)),
                                      expected[[0, 1, 3]])
        np.testing.assert_array_equal(client.pull_sparse("clicks", np.array([5, -3], np.int8)), expected[[0, 2]])
        np.testing.assert_array_equal(client.pull_sparse("clicks", [5, -3]), expected[[0, 2]])
        assert client.pull_sparse("clicks", np.array([])).shape == (0, 4)  # an empty batch has no value to misread
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_torch_distributed_embedding_refuses_float_ids_before_sending(servers) -> None:
    torch = pytest.importorskip("torch")
    import unison.ps.torch as pst

    client = _client(servers)
    try:
        bag = pst.DistributedEmbedding("ads", 100, 4, mode="sum", client=client)
        ok = bag(torch.tensor([[1, 2], [3, 4]]))
        before = _served(client)
        for ids, detail in ((torch.tensor([[1.7, 2.0]]), r"dtype float32, for example 1\.7000000476837158"),
                            (torch.tensor([[1.0, float("nan")]], dtype=torch.float64), r"dtype float64, for example nan"),
                            (torch.tensor([[1.5]], dtype=torch.bfloat16), r"dtype torch\.bfloat16, for example 1\.5"),
                            (torch.tensor([[True]]), r"dtype bool, for example True")):
            with pytest.raises(RequestError, match=r"ids of table 'ads' must be integers \(any int64 value\); nothing "
                               r"was sent\. Got " + detail):
                bag(ids)
        assert _served(client) == before
        torch.testing.assert_close(bag(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)), ok)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_capacity_errors_quote_the_capacity_the_user_passed(servers) -> None:
    first, second = _client(servers, 0), _client(servers, 1)
    try:
        with pytest.raises(RequestError, match=r"table 'huge': capacity \(the most distinct ids it holds\) must be an "
                           r"integer in \[1, 17179869184\]\. Got capacity=4611686018427387904\."):
            first.declare_table("huge", dim=8, capacity=2**62)
        with pytest.raises(RequestError, match=r"table 'wide': dim \(the width of a row\) must be an integer in "
                           r"\[1, 65536\]\. Got dim=100000\."):
            first.declare_table("wide", dim=100_000, capacity=10)
        first.declare_table("emb", dim=8, capacity=1000)
        with pytest.raises(RequestError, match=r"table 'emb' was declared differently before; capacity: 1000 here, 5 "
                           r"from trainer 1\. Every trainer must declare the same parameters\."):
            second.declare_table("emb", dim=8, capacity=5)
        second.declare_table("emb", dim=8, capacity=1000)  # the same declaration is fine
        stats = first.server_statistics()
        assert [s["tables"]["emb"]["declared_capacity"] for s in stats] == [1000, 1000]
        assert [s["tables"]["emb"]["capacity"] for s in stats] == [641, 641]  # each server's share
        assert "huge" not in stats[0]["tables"] and "wide" not in stats[0]["tables"]
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(60)
def test_a_dense_gradient_of_another_shape_is_refused_even_with_the_same_size(servers) -> None:
    client = _client(servers)
    try:
        client.declare_dense({"w": np.zeros((4, 4), np.float32)}, SGD(1.0))
        before = _served(client)
        with pytest.raises(RequestError, match=r"the gradient of 'w' has shape \(2, 8\); the parameter was declared "
                           r"with shape \(4, 4\), and a gradient must have the parameter's shape \(nothing was sent\)"):
            client.push(dense={"w": np.ones((2, 8), np.float32)})
        with pytest.raises(RequestError, match=r"the gradient of 'w' has shape \(16,\)"):
            client.push(dense={"w": np.ones(16, np.float32)})
        assert _served(client) == before
        client.push(dense={"w": np.ones((4, 4), np.float32)})
        np.testing.assert_array_equal(client.pull_dense()["w"], -np.ones((4, 4)))
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_server_optimizer_refuses_a_parameter_whose_shape_changed(servers) -> None:
    torch = pytest.importorskip("torch")
    import unison.ps.torch as pst

    client = _client(servers)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 1))
        opt = pst.ServerOptimizer(model, SGD(0.1), client=client)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        before = _served(client)
        model[0].weight = torch.nn.Parameter(torch.zeros(1, 8))  # (1, 4) -> (1, 8)
        model[0].in_features = 8
        opt.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        with pytest.raises(RequestError, match=r"ServerOptimizer trains the parameters the model had when it was made, "
                           r"with their shapes then; '0\.weight' has shape \(1, 8\) now \(declared \(1, 4\)\), and is "
                           r"another tensor than the one declared\. Nothing was pushed\."):
            opt.step()
        model[0].weight = opt.params["0.weight"]  # the declared tensor again, resized in place
        model[0].weight.data = torch.zeros(1, 8)
        opt.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        with pytest.raises(RequestError, match=r"'0\.weight' has shape \(1, 8\) now \(declared \(1, 4\)\)\. Nothing "
                           r"was pushed\."):
            opt.step()
        assert _served(client) == before
    finally:
        client.close()
