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
    """Half of each global batch, the model of tests/ps/test_ps_jobs.py's reference (TABLE_OPTIMIZER=adagrad:
    Adagrad(0.05) on the table instead of SGD(0.5); STEPS: how many global batches, 6)."""
    import torch

    import unison.ps.torch as pst
    from tests.ps.reference import batches, make_model

    client = ps.init()
    table_optimizer = ps.Adagrad(0.05) if os.environ.get("TABLE_OPTIMIZER") == "adagrad" else ps.SGD(0.5)
    model = make_model(lambda: pst.DistributedEmbedding("emb", 64, 8, mode="mean", initializer=ps.Initializer(
        "uniform", 0.5, seed=3), optimizer=table_optimizer))
    opt = pst.ServerOptimizer(model, ps.Adam(0.01))
    for ids, target in batches(int(os.environ.get("STEPS", "6"))):
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
    """Push small steps until OUT.stop exists (OUT.stepped after the first); write the steps made to OUT."""
    client = ps.init()
    ps.declare_dense({"w": np.zeros(100, np.float32)}, ps.SGD(0.001))
    steps = 0
    while not Path(str(out) + ".stop").exists():
        ps.pull_dense()
        ps.push(dense={"w": np.ones(100, np.float32)})
        steps += 1
        if steps == 1:
            Path(f"{out}.stepped").write_text("")
        time.sleep(0.01)
    out.write_text(json.dumps({"steps": steps, "trainer": client.trainer}))
    ps.shutdown()


def async_outlive() -> None:
    """Push steps (OUT.ready after the fifth) until OUT.stop exists; then wait until every server counts the
    other trainers lost, and write the servers' statistics and the steps made to OUT."""
    client = ps.init()
    ps.declare_dense({"w": np.zeros(100, np.float32)}, ps.SGD(0.001))
    steps = 0
    while not Path(str(out) + ".stop").exists():
        ps.pull_dense()
        ps.push(dense={"w": np.ones(100, np.float32)})
        steps += 1
        if steps == 5:
            Path(f"{out}.ready").write_text("")
        time.sleep(0.01)
    deadline = time.monotonic() + 30
    stats = ps.server_statistics()
    while not all(len(s["lost_trainers"]) == client.num_trainers - 1 for s in stats):
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
        stats = ps.server_statistics()
    out.write_text(json.dumps({"steps": steps, "servers": stats}))
    ps.shutdown()


def sync_until_lost() -> None:
    """Steps (OUT.ready after the third) until an error stops them; write it and when to OUT, exit 3.

    Two parameters, so with two servers every pull and push reaches both."""
    ps.init()
    ps.declare_dense({"w": np.zeros(4, np.float32), "v": np.zeros(4, np.float32)}, ps.SGD(0.1))
    steps = 0
    try:
        while True:
            ps.pull_dense()
            ps.push(dense={"w": np.ones(4, np.float32), "v": np.ones(4, np.float32)})
            steps += 1
            if steps == 3:
                Path(f"{out}.ready").write_text("")
            time.sleep(0.01)
    except (ps.TrainerLostError, ps.ServerUnavailableError) as exc:
        out.write_text(json.dumps({"error": str(exc), "type": type(exc).__name__, "steps": steps,
                                   "at": time.time()}))
        raise SystemExit(3) from None


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


def _keras_dense_model(seed: int, embedding: object | None, name: str = "net") -> object:
    """The dense model of the ServerOptimizer tests: an MLP, after a 3-id embedding when one is given."""
    import keras

    keras.utils.set_random_seed(seed)
    if embedding is None:
        head = [keras.Input((5,))]
    else:
        head = [keras.Input((3,), dtype="int64"), embedding, keras.layers.Flatten()]
    return keras.Sequential([*head, keras.layers.Dense(4, activation="tanh", name="hidden"),
                             keras.layers.Dense(1, name="out")], name=name)


def _keras_dense_data(embedding: bool, steps: int = 6, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    if embedding:
        x = rng.integers(0, 64, size=(steps * size, 3)).astype(np.int64)
    else:
        x = rng.standard_normal((steps * size, 5)).astype(np.float32)
    return x, rng.standard_normal((steps * size, 1)).astype(np.float32)


def keras_dense_sync() -> None:
    """model.fit with ServerOptimizer on this trainer's half of every global batch of 16 (KERAS_EMBEDDING=1 puts
    a DistributedEmbedding first, KERAS_EAGER=1 runs eagerly). Trainer 0 also trains the reference: the same
    model from its own starting values on the global batches in one process, the servers' optimizer applied
    in NumPy (and SGD to a keras.layers.Embedding's matrix)."""
    import keras
    import tensorflow as tf

    import unison.ps.keras as psk

    client = ps.init()
    embedded = os.environ.get("KERAS_EMBEDDING") == "1"
    eager = os.environ.get("KERAS_EAGER") == "1"
    init = ps.Initializer("uniform", 0.5, seed=3)
    dense_opt = ps.Momentum(0.1, momentum=0.9) if embedded else ps.Adam(0.01)
    layer = psk.DistributedEmbedding("emb", 64, 8, initializer=init, optimizer=ps.SGD(0.5)) if embedded else None
    model = _keras_dense_model(10 + client.trainer, layer)  # each trainer starts from its own values
    start = [w.copy() for w in model.get_weights()]
    opt = psk.ServerOptimizer(dense_opt)
    model.compile(optimizer=opt, loss="mse", run_eagerly=eager)
    if eager:  # an eager step builds its optimizer after the forward pass: too late
        opt.build(model.trainable_variables)
    x, y = _keras_dense_data(embedded)
    mine = np.concatenate([np.arange(i, i + 8) + 8 * client.trainer for i in range(0, len(x), 16)])
    history = model.fit(x[mine], y[mine], batch_size=8, epochs=1, shuffle=False, verbose=0)
    got = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    if embedded:
        got["rows"] = ps.pull_sparse("emb", np.arange(64))
        got["layer_pushes"] = np.array(layer.statistics()["pushes"])
    got.update(loss=np.array(history.history["loss"]), start0=start[0], steps=np.array(opt.statistics()["steps"]),
               version=np.array(ps.server_statistics()[0]["version"]))
    if client.trainer == 0:
        ref = _keras_dense_model(0, keras.layers.Embedding(64, 8) if embedded else None, name="reference")
        ref.set_weights(([init.rows(np.arange(64), 8)] if embedded else []) + start[int(embedded):])
        states = [(dense_opt.new_slots((1, int(np.prod(v.shape)))), np.zeros(1, np.int64)) for v in ref.trainable_variables]
        for i in range(0, len(x), 16):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(ref(x[i:i + 16]) - y[i:i + 16]))
            for k, (v, g) in enumerate(zip(ref.trainable_variables, tape.gradient(loss, ref.trainable_variables))):
                value, grad = v.numpy().reshape(1, -1), tf.convert_to_tensor(g).numpy().reshape(1, -1)
                if embedded and k == 0:
                    value -= np.float32(0.5) * grad  # the table's SGD
                else:
                    dense_opt.apply(value, *states[k], np.array([0]), grad)
                v.assign(value.reshape(v.shape))
        got.update({f"ref{i}": w for i, w in enumerate(ref.get_weights())})
    np.savez(out, **got)
    ps.shutdown()


def keras_dense_async() -> None:
    """model.fit with ServerOptimizer(SGD) in asynchronous mode on this trainer's share of a linear regression;
    both trainers start once both said hello, and read the servers' statistics once both finished."""

    import unison.ps.keras as psk

    client = ps.init()
    deadline = time.monotonic() + 60
    while len(ps.server_statistics()[0]["trainers"]) < client.num_trainers and time.monotonic() < deadline:
        time.sleep(0.05)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1600, 5)).astype(np.float32)
    y = (x @ rng.standard_normal((5, 1)) + 0.05 * rng.standard_normal((1600, 1))).astype(np.float32)
    mine = slice(client.trainer, None, client.num_trainers)
    model = _keras_dense_model(client.trainer, None)
    opt = psk.ServerOptimizer(ps.SGD(0.05))
    model.compile(optimizer=opt, loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x[mine], y[mine], batch_size=4, epochs=2, shuffle=False, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    Path(f"{out}.done").write_text("")
    others = [Path(str(out).replace(f"t{client.trainer}", f"t{t}") + ".done") for t in range(client.num_trainers)]
    while not all(p.exists() for p in others) and time.monotonic() < deadline + 120:
        time.sleep(0.05)
    out.write_text(json.dumps({"loss": [before, after], "optimizer": opt.statistics(),
                               "servers": ps.server_statistics()}))
    ps.shutdown()


def keras_dense_errors() -> None:
    """Misuses of ServerOptimizer, each caught and written to OUT as {case: [error type, message]}."""
    import keras

    import unison.ps.keras as psk

    ps.init()
    x, y = _keras_dense_data(False, steps=1)
    caught: dict[str, list[str]] = {}

    def attempt(case: str, action: object) -> None:
        try:
            action()  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - recorded for the test to check
            caught[case] = [type(exc).__name__, str(exc)]

    def fit(model: keras.Model, opt: object, **compile_args: object) -> None:
        model.compile(optimizer=opt, loss="mse", **compile_args)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)

    attempt("keras_optimizer", lambda: psk.ServerOptimizer(keras.optimizers.Adam()))  # type: ignore[arg-type]
    grown = _keras_dense_model(0, None, name="grown")
    grown_opt = psk.ServerOptimizer(ps.SGD(0.1), name="grown_opt")
    fit(grown, grown_opt)
    grown.add(keras.layers.Dense(1, name="extra"))
    attempt("created_after", lambda: fit(grown, grown_opt))
    first = _keras_dense_model(0, None, name="resized")
    resized_opt = psk.ServerOptimizer(ps.SGD(0.1), name="resized_opt")
    fit(first, resized_opt)
    keras.utils.set_random_seed(0)
    wider = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh", name="hidden"),
                              keras.layers.Dense(1, name="out")], name="resized")
    attempt("shape_changed", lambda: fit(wider, resized_opt))
    attempt("eager_unbuilt", lambda: fit(_keras_dense_model(0, None, name="eager"),
                                         psk.ServerOptimizer(name="eager_opt"), run_eagerly=True))
    attempt("xla", lambda: fit(_keras_dense_model(0, None, name="xla"), psk.ServerOptimizer(name="xla_opt"),
                               jit_compile=True))
    out.write_text(json.dumps(caught))
    ps.shutdown()


def keras_dense_lost() -> None:
    """Synchronous model.fit with ServerOptimizer; trainer 1 leaves after 2 steps without telling the servers,
    trainer 0 writes the error that ends its fit to OUT as [type, message]."""
    import unison.ps.keras as psk

    client = ps.init()
    model = _keras_dense_model(0, None)
    model.compile(optimizer=psk.ServerOptimizer(ps.SGD(0.1)), loss="mse")
    x, y = _keras_dense_data(False, steps=10, size=8)
    if client.trainer == 1:
        model.fit(x[:16], y[:16], batch_size=8, epochs=1, shuffle=False, verbose=0)
        os._exit(0)
    try:
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    except Exception as exc:  # noqa: BLE001 - recorded for the test to check
        out.write_text(json.dumps([type(exc).__name__, str(exc)]))
        raise SystemExit(3) from None
    out.write_text(json.dumps(["none", "fit ended without an error"]))


{"sync_torch": sync_torch, "digits_async": digits_async, "async_steps": async_steps, "sync_quit": sync_quit,
 "async_outlive": async_outlive, "sync_until_lost": sync_until_lost,
 "sync_pauses": sync_pauses, "keras_sync": keras_sync,
 "keras_mask": keras_mask, "keras_dense_sync": keras_dense_sync, "keras_dense_async": keras_dense_async,
 "keras_dense_errors": keras_dense_errors,
 "keras_dense_lost": keras_dense_lost}[scenario]()
