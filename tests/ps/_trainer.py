"""Trainer scenarios of the multi-process parameter-server tests: `python _trainer.py SCENARIO OUT`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import unison.ps as ps

scenario, out = sys.argv[1], Path(sys.argv[2])


def sync_torch() -> None:
    """Half of each global batch, the model of tests/ps/test_ps_jobs.py's reference."""
    import torch

    import unison.ps.torch as pst
    from tests.ps.reference import batches, make_model

    client = ps.init()
    model = make_model(lambda: pst.DistributedEmbedding("emb", 64, 8, mode="mean", initializer=ps.Initializer(
        "uniform", 0.5, seed=3), optimizer=ps.SGD(0.5)))
    opt = pst.ServerOptimizer(model, ps.Adam(0.01))
    for ids, target in batches():
        half = slice(client.trainer * len(ids) // 2, (client.trainer + 1) * len(ids) // 2)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(ids[half])), torch.from_numpy(target[half]))
        loss.backward()
        opt.step()
    rows = ps.pull_sparse("emb", np.arange(64))
    np.savez(out, rows=rows, **{k: v.detach().numpy() for k, v in model.named_parameters()})
    ps.shutdown()


def digits_async() -> None:
    from sklearn.datasets import load_digits

    client = ps.init()
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(y))  # the same split on every trainer
    test = order[1400:]
    mine = order[:1400][client.trainer::client.num_trainers]
    ps.declare_dense({"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}, ps.Momentum(0.2))
    rng = np.random.default_rng(client.trainer)
    for _ in range(10):
        for batch in np.array_split(rng.permutation(mine), 20):
            p = ps.pull_dense()
            logits = x[batch] @ p["w"] + p["b"]
            probs = np.exp(logits - logits.max(1, keepdims=True))
            probs /= probs.sum(1, keepdims=True)
            probs[np.arange(len(batch)), y[batch]] -= 1
            ps.push(dense={"w": x[batch].T @ probs / len(batch), "b": probs.mean(0)})
    p = ps.pull_dense()
    accuracy = float(((x[test] @ p["w"] + p["b"]).argmax(1) == y[test]).mean())
    stats = ps.server_statistics()
    out.write_text(json.dumps({"accuracy": accuracy, "servers": stats}))
    ps.shutdown()


def async_steps() -> None:
    """Push small steps until OUT.stop exists; write the steps made to OUT."""
    client = ps.init()
    ps.declare_dense({"w": np.zeros(100, np.float32)}, ps.SGD(0.001))
    steps = 0
    while not Path(str(out) + ".stop").exists():
        ps.pull_dense()
        ps.push(dense={"w": np.ones(100, np.float32)})
        steps += 1
        time.sleep(0.01)
    out.write_text(json.dumps({"steps": steps, "trainer": client.trainer}))
    ps.shutdown()


def sync_quit() -> None:
    """Two synchronous steps, then leave without telling the servers (as a crash would)."""
    ps.init()
    ps.declare_dense({"w": np.zeros(4, np.float32)}, ps.SGD(0.1))
    for _ in range(2):
        ps.pull_dense()
        ps.push(dense={"w": np.ones(4, np.float32)})
    os._exit(0)


def sync_pauses() -> None:
    """STEPS synchronous steps of w -= 0.1 (SGD, gradient one); after pulling each step of PAUSES, write
    OUT.ready-<step> and wait for OUT.go-<step>. Write w, or the error that stopped training, to OUT."""
    ps.init()
    ps.declare_dense({"w": np.zeros(4, np.float32)}, ps.SGD(0.1))
    pauses = {int(s) for s in os.environ["PAUSES"].split(",")}
    try:
        for step in range(int(os.environ["STEPS"])):
            ps.pull_dense()
            if step in pauses:
                Path(f"{out}.ready-{step}").write_text("")
                deadline = time.monotonic() + 60
                while not Path(f"{out}.go-{step}").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            ps.push(dense={"w": np.ones(4, np.float32)})
        w = ps.pull_dense()["w"]
    except ps.RequestError as exc:
        out.write_text(json.dumps({"error": str(exc)}))
        raise SystemExit(3) from None
    out.write_text(json.dumps({"w": w.tolist()}))
    ps.shutdown()


def keras_sync() -> None:
    """A Keras model with the layer trained by model.fit, and the same model with keras.layers.Embedding.

    The environment variable KERAS_EAGER=1 runs both with run_eagerly=True.
    """
    import keras

    import unison.ps.keras as psk

    ps.init()
    init = ps.Initializer("uniform", 0.5, seed=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 48, size=(64, 3)).astype(np.int64)  # ids 48..63 are never seen
    target = rng.standard_normal((64, 1)).astype(np.float32)
    eager = os.environ.get("KERAS_EAGER") == "1"

    def make(embedding: keras.layers.Layer) -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,), dtype="int64"), embedding, keras.layers.Flatten(),
                                  keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", run_eagerly=eager)
        return model

    layer = psk.DistributedEmbedding("emb", 64, 8, initializer=init, optimizer=ps.SGD(0.5))
    model = make(layer)
    local = make(keras.layers.Embedding(64, 8))
    local.layers[0].set_weights([init.rows(np.arange(64), 8)])
    for a, b in zip(model.layers[1:], local.layers[1:]):
        b.set_weights(a.get_weights())
    history = model.fit(ids, target, batch_size=16, epochs=2, shuffle=False, verbose=0)
    local.fit(ids, target, batch_size=16, epochs=2, shuffle=False, verbose=0)
    rows = ps.pull_sparse("emb", np.arange(64))
    dense = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    ref = {f"ref{i}": w for i, w in enumerate(local.get_weights())}
    np.savez(out, rows=rows, seen=np.unique(ids), loss=np.array(history.history["loss"]),
             stats=np.array([layer.statistics()["pushes"]]), **dense, **ref)
    ps.shutdown()


def keras_mask() -> None:
    """mask_zero: the layer with padding id 0 under model.fit, beside keras.layers.Embedding with and without it."""
    import keras

    import unison.ps.keras as psk

    ps.init()
    init = ps.Initializer("uniform", 0.5, seed=5)
    rng = np.random.default_rng(2)
    ids = rng.integers(1, 32, size=(48, 5)).astype(np.int64)
    ids[:, 2:] *= rng.integers(0, 2, size=(48, 3))  # some padding in most rows
    ids[::4, 1:] = 0  # and rows of one id
    target = rng.standard_normal((48, 1)).astype(np.float32)

    def make(embedding: keras.layers.Layer) -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((5,), dtype="int64"), embedding, keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        return model

    layer = psk.DistributedEmbedding("emb", 32, 4, initializer=init, optimizer=ps.SGD(0.5), mask_zero=True)
    model = make(layer)
    refs = {}
    for masked in (True, False):
        refs[masked] = make(keras.layers.Embedding(32, 4, mask_zero=masked))
        refs[masked].layers[0].set_weights([init.rows(np.arange(32), 4)])
        refs[masked].layers[-1].set_weights(model.layers[-1].get_weights())
    mask = np.asarray(layer.compute_mask(ids))
    model.fit(ids, target, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for ref in refs.values():
        ref.fit(ids, target, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.savez(out, rows=ps.pull_sparse("emb", np.arange(32)), start=init.rows(np.arange(32), 4), mask=mask, ids=ids,
             pred=model.predict(ids, verbose=0), config=np.array([layer.get_config()["mask_zero"]]),
             **{f"ref_{m}_rows": r.layers[0].get_weights()[0] for m, r in refs.items()},
             **{f"ref_{m}_pred": r.predict(ids, verbose=0) for m, r in refs.items()})
    ps.shutdown()


{"sync_torch": sync_torch, "digits_async": digits_async, "async_steps": async_steps, "sync_quit": sync_quit,
 "sync_pauses": sync_pauses, "keras_sync": keras_sync,
 "keras_mask": keras_mask}[scenario]()
