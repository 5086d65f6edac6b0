"""Parameter-server jobs as real processes: sync equals all-reduce training, async converges, faults, bytes."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.ps._cluster import SECRET, free_port, run_job, start_server, start_trainer, stop, wait_all
from unison.ps import SGD, Client, Initializer, TrainerLostError


def _endpoints(n: int) -> list[str]:
    return [f"127.0.0.1:{free_port()}" for _ in range(n)]


def _observer(endpoints: list[str]) -> Client:
    """A client that only reads the servers' statistics (it never says hello, so it is no trainer)."""
    return Client(endpoints, SECRET, trainer=0, num_trainers=2, reconnect_seconds=20.0, heartbeat_seconds=0)


@pytest.mark.timeout(90)
def test_sync_training_equals_single_process_training_on_the_global_batch(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from tests.ps.reference import batches, make_model

    outs = run_job(tmp_path, "sync_torch", "sync", trainers=2, servers=2, timeout=80)
    init = Initializer("uniform", 0.5, seed=3)

    def embedding() -> torch.nn.Module:
        bag = torch.nn.EmbeddingBag(64, 8, mode="mean")
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(init.rows(np.arange(64), 8)))
        return bag

    model = make_model(embedding)
    emb_opt = torch.optim.SGD(model[0].parameters(), lr=0.5)
    dense_opt = torch.optim.Adam([p for n, p in model.named_parameters() if not n.startswith("0.")], lr=0.01)
    for ids, target in batches():
        emb_opt.zero_grad(), dense_opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.from_numpy(ids)), torch.from_numpy(target)).backward()
        emb_opt.step(), dense_opt.step()
    for out in outs:
        got = np.load(out)
        np.testing.assert_allclose(got["rows"], model[0].weight.detach().numpy(), rtol=1e-5, atol=1e-6)
        for name, p in model.named_parameters():
            if not name.startswith("0."):
                np.testing.assert_allclose(got[name], p.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(got["rows"], init.rows(np.arange(64), 8))  # the rows did train


@pytest.mark.timeout(120)
def test_sync_training_with_adagrad_and_adam_matches_torch_to_float32_rounding(tmp_path) -> None:
    """The table's Adagrad and the dense Adam follow torch's float32 operations (docs/ps.md, "Numerics"):
    over 30 global batches the rows and weights stay within 1e-6 of torch's (measured 1.5e-7, as far as
    torch's own float32 run is from a float64 one; 6.3e-6 when Adam rounded 1 - beta2 from float32)."""
    torch = pytest.importorskip("torch")
    from tests.ps.reference import batches, make_model

    steps = 30
    outs = run_job(tmp_path, "sync_torch", "sync", trainers=2, servers=2, timeout=100, TABLE_OPTIMIZER="adagrad",
                   STEPS=str(steps))
    init = Initializer("uniform", 0.5, seed=3)

    def embedding() -> torch.nn.Module:
        bag = torch.nn.EmbeddingBag(64, 8, mode="mean")
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(init.rows(np.arange(64), 8)))
        return bag

    model = make_model(embedding)
    emb_opt = torch.optim.Adagrad(model[0].parameters(), lr=0.05)
    dense_opt = torch.optim.Adam([p for n, p in model.named_parameters() if not n.startswith("0.")], lr=0.01)
    for ids, target in batches(steps):
        emb_opt.zero_grad(), dense_opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.from_numpy(ids)), torch.from_numpy(target)).backward()
        emb_opt.step(), dense_opt.step()
    for out in outs:
        got = np.load(out)
        np.testing.assert_allclose(got["rows"], model[0].weight.detach().numpy(), rtol=0, atol=1e-6)
        for name, p in model.named_parameters():
            if not name.startswith("0."):
                np.testing.assert_allclose(got[name], p.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.timeout(90)
def test_async_training_converges_on_digits(tmp_path) -> None:
    pytest.importorskip("sklearn")
    for out in run_job(tmp_path, "digits_async", "async", trainers=2, servers=2, timeout=80, suffix="json"):
        result = json.loads(out.read_text())
        assert result["accuracy"] > 0.9, result["accuracy"]
        for stats in result["servers"]:
            assert sum(stats["staleness_histogram"].values()) == stats["pushes"]


@pytest.mark.timeout(60)
def test_bytes_per_step_follow_the_unique_ids_of_a_million_row_table() -> None:
    endpoints = _endpoints(1)
    server = start_server(0, endpoints, 1, "async")
    client = Client(endpoints, SECRET, trainer=0, num_trainers=1, heartbeat_seconds=0)
    try:
        client.connect()
        client.declare_table("big", dim=64, capacity=1_000_000, optimizer=SGD(0.1))
        rng = np.random.default_rng(0)
        for step in range(5):
            ids = np.minimum(rng.zipf(1.2, size=4096), 1_000_000) - 1 + step * 100_000
            unique = np.unique(ids)
            server_before = client.server_statistics()[0]
            before = client.statistics()
            rows = client.pull_sparse("big", ids)
            client.push(sparse={"big": (ids, np.ones_like(rows))})
            after = client.statistics()
            server_after = client.server_statistics()[0]
            moved = after["bytes_sent"] + after["bytes_received"] - before["bytes_sent"] - before["bytes_received"]
            payload = len(unique) * (2 * 8 + 2 * 64 * 4)  # ids up twice, rows down once and gradients up once
            assert payload <= moved <= payload + 200, (len(unique), moved, payload)
            served = (server_after["bytes_in"] + server_after["bytes_out"] - server_before["bytes_in"]
                      - server_before["bytes_out"])
            # the server's count also holds the reply that carried `server_before` (a JSON object)
            status_reply = len(json.dumps(server_before)) + 8
            assert payload <= served <= payload + 200 + status_reply, (served, payload, status_reply)
            assert after["rows_pulled"] - before["rows_pulled"] == len(unique)
        stats = client.server_statistics()[0]
        assert stats["tables"]["big"]["capacity"] == 1_000_000
        assert stats["memory_bytes"] < 64 * 1024 * 1024  # only the touched rows exist
        client.finish()
        assert server.wait(20) == 0
    finally:
        client.close()
        stop(server)


@pytest.mark.timeout(90)
def test_a_killed_trainer_does_not_stop_async_training_and_rejoins(tmp_path) -> None:
    endpoints = _endpoints(1)
    server = start_server(0, endpoints, 2, "async")
    out = [tmp_path / "t0.json", tmp_path / "t1.json"]
    trainers = [start_trainer(t, endpoints, 2, "async", "async_steps", out[t]) for t in range(2)]
    observer = _observer(endpoints)
    try:
        def seen() -> dict:
            return observer.server_statistics()[0]["trainers"]

        deadline = time.monotonic() + 40
        while not (len(seen()) == 2 and min(t["pushed"] for t in seen().values()) >= -1
                   and observer.server_statistics()[0]["version"] > 20):
            assert time.monotonic() < deadline, "the trainers did not start pushing"
            time.sleep(0.2)
        first_pid = seen()["1"]["pid"]
        stop(trainers[1])
        version = observer.server_statistics()[0]["version"]
        while observer.server_statistics()[0]["version"] <= version + 10:  # trainer 0 goes on alone
            assert time.monotonic() < deadline + 30 and trainers[0].poll() is None, "trainer 0 stopped"
            time.sleep(0.2)
        assert trainers[0].poll() is None
        stepped = tmp_path / (out[1].name + ".stepped")  # written after a trainer 1's first step
        stepped.unlink(missing_ok=True)  # by the one stopped
        trainers[1] = start_trainer(1, endpoints, 2, "async", "async_steps", out[1])
        while seen()["1"]["pid"] == first_pid:
            assert time.monotonic() < deadline + 30, "the restarted trainer did not rejoin"
            time.sleep(0.2)
        while not stepped.exists():
            assert time.monotonic() < deadline + 30 and trainers[1].poll() is None, "trainer 1 made no step"
            time.sleep(0.05)
        for o in out:
            (tmp_path / (o.name + ".stop")).write_text("")
        assert wait_all(trainers, 30) == [0, 0]
        assert server.wait(20) == 0
        assert json.loads(out[1].read_text())["steps"] > 0
    finally:
        observer.close()
        stop(*trainers, server)


@pytest.mark.timeout(90)
def test_a_killed_server_resumes_from_its_checkpoint(tmp_path) -> None:
    endpoints = _endpoints(1)
    ckpt = str(tmp_path / "ckpt")
    server = start_server(0, endpoints, 1, "async", UNISON_PS_CHECKPOINT_DIR=ckpt)
    client = Client(endpoints, SECRET, trainer=0, num_trainers=1, reconnect_seconds=30.0)
    try:
        client.connect()
        client.declare_dense({"w": np.arange(20000, dtype=np.float32)}, SGD(0.5))
        client.declare_table("emb", dim=8, capacity=1000, optimizer=SGD(0.5))
        ids = np.arange(0, 300, 3)
        for _ in range(5):
            client.pull(["w"], {"emb": ids})
            client.push(dense={"w": np.ones(20000)}, sparse={"emb": (ids, np.ones((len(ids), 8)))})
        (path,) = client.checkpoint()
        saved, saved_rows = client.pull(["w"], {"emb": ids})
        client.push(dense={"w": np.ones(20000)})  # lost with the server: after the checkpoint
        stop(server)
        server = start_server(0, endpoints, 1, "async", UNISON_PS_CHECKPOINT_DIR=ckpt)
        values, rows = client.pull(["w"], {"emb": ids})  # waits for the new server
        np.testing.assert_array_equal(values["w"], saved["w"])
        np.testing.assert_array_equal(rows["emb"], saved_rows["emb"])
        stats = client.server_statistics()[0]
        assert stats["restored"] and stats["version"] == 5 and stats["tables"]["emb"]["rows"] == 100
        assert client.statistics()["retries"] >= 0
        client.push(dense={"w": np.ones(20000)})
        np.testing.assert_allclose(client.pull_dense()["w"], saved["w"] - 0.5)
        client.finish()
        assert server.wait(20) == 0
        assert path.endswith("server-0-of-1.npz")
    finally:
        client.close()
        stop(server)


@pytest.mark.timeout(60)
def test_a_lost_trainer_ends_the_sync_step_with_an_error_naming_it(tmp_path) -> None:
    endpoints = _endpoints(1)
    server = start_server(0, endpoints, 2, "sync", UNISON_PS_TRAINER_TIMEOUT_SECONDS="1.5")
    quitter = start_trainer(1, endpoints, 2, "sync", "sync_quit", tmp_path / "t1")
    client = Client(endpoints, SECRET, trainer=0, num_trainers=2, mode="sync")
    try:
        client.connect()
        client.declare_dense({"w": np.zeros(4, np.float32)}, SGD(0.1))
        with pytest.raises(TrainerLostError, match=r"step 2 did not complete on parameter server 0: trainer 1 "
                           r"\(\S+, pid \d+\) pushed steps up to 1 and sent nothing for \d+\.\d s; it died or is stopped"):
            for _ in range(10):
                client.pull_dense()
                client.push(dense={"w": np.ones(4, np.float32)})
        assert client.step == 3 and quitter.wait(10) == 0
    finally:
        client.close()
        stop(quitter, server)
