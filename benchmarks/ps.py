"""Click-through-rate model on parameter servers against all-reduce: samples/s and bytes per step.

The model: 8 sparse fields with Zipf-distributed ids (a = 1.1, 100,000 ids) summed into an embedding
bag of width 16, then an MLP (16-64-1) with a logistic loss, batch 512 per trainer. Two trainers
on this machine (shared memory), 1 or 2 servers. Modes:

- ``ps-async`` / ``ps-sync``: `unison.ps.torch.DistributedEmbedding` + `ServerOptimizer`; bytes per
  step are the trainer's counted serialized messages (pull and push);
- ``allreduce``: `unison.torch.DistributedOptimizer` under mpiexec, the embedding a dense
  ``nn.EmbeddingBag`` whose whole gradient is reduced each step; bytes per step are the gradient
  bytes each rank submits (a ring moves about twice that per rank);
- ``tf-pss``: TensorFlow's ``tf.distribute.experimental.ParameterServerStrategy`` on an in-process
  cluster (``tf.distribute.Server`` objects for 2 workers and 1 or 2 ps in one process, which is the
  coordinator), a Keras 3 model (``keras.layers.Embedding`` summed over the fields, the same MLP)
  built under ``strategy.scope()``, Adagrad(0.05) on the embedding and Adam(0.001) on the MLP as in
  the unison modes; a ``ClusterCoordinator`` schedules both trainers' batches (``2 * steps``
  closures of batch 512), the rate is timed from the join after the warm-up closures to the last
  join. Its bytes per step are not counted.

Run: ``python benchmarks/ps.py`` (writes benchmarks/results/ps.json).

``python benchmarks/ps.py --hosts`` instead runs on 2 emulated hosts (`unison.testing.hosts`, network
namespaces with 1 Gbit/s links; needs root), one trainer per host: ``ps-async`` and ``ps-sync``
under ``unisonrun -np 2 --pservers 2`` (one server per host, placed by unisonrun), and
``allreduce`` under ``unisonrun -np 2`` on the TCP netmod of the emulated links. The three modes
run in rounds, each round starting with the next mode (so none always runs first or last); the
table takes each mode's median over the rounds, with the load average before every run. It writes
the ``emulated_hosts`` entry of benchmarks/results/ps.json and leaves the rest as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIELDS, IDS, DIM, BATCH = 8, 100_000, 16, 512
SECRET = "b" * 64


def _batches(seed: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = (np.minimum(rng.zipf(1.1, size=(BATCH, FIELDS)), IDS) - 1).astype(np.int64)
        labels = ((ids[:, 0] % 7) < 3).astype(np.float32)[:, None]
        out.append((ids, labels))
    return out


def _model(embedding):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(embedding, nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))


def _train(model, step_fn, batches, warmup: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    started = 0.0
    for i, (ids, labels) in enumerate(batches):
        if i == warmup:
            started = time.perf_counter()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)),
                                                                    torch.from_numpy(labels))
        loss.backward()
        step_fn()
    return (len(batches) - warmup) * BATCH / (time.perf_counter() - started)


def trainer(mode: str, steps: int, warmup: int, out: str) -> None:
    """One trainer process of a ps mode (its role comes from UNISON_PS_* variables)."""
    import torch

    import unison.ps as ps
    import unison.ps.torch as pst

    torch.set_num_threads(1)
    client = ps.init()
    model = _model(pst.DistributedEmbedding("ctr", 2 * IDS, DIM, mode="sum", optimizer=ps.Adagrad(0.05)))
    opt = pst.ServerOptimizer(model, ps.Adam(0.001))
    batches = _batches(client.trainer, steps)
    while len(client.server_statistics()[0]["trainers"]) < client.num_trainers:
        time.sleep(0.05)  # start together: the trainers' imports take seconds of a short run
    before = {}

    def step() -> None:
        nonlocal before
        opt.step()
        opt.zero_grad()
        if client.step == warmup:
            before = client.statistics()

    rate = _train(model, step, batches, warmup)
    out = out.replace("{trainer}", str(client.trainer))
    after = client.statistics()
    moved = after["bytes_sent"] + after["bytes_received"] - before["bytes_sent"] - before["bytes_received"]
    unique = float(np.mean([len(np.unique(ids)) for ids, _ in batches[warmup:]]))
    servers = client.server_statistics()
    Path(out).write_text(json.dumps({"samples_per_second": rate, "bytes_per_step": moved / (steps - warmup),
                                     "unique_ids_per_step": unique,
                                     "staleness_max": max(s["staleness_max"] for s in servers),
                                     "server_memory_bytes": [s["memory_bytes"] for s in servers]}))
    ps.shutdown()


def allreduce_trainer(steps: int, warmup: int, out: str) -> None:
    """One rank of the all-reduce mode (under mpiexec)."""
    import torch

    import unison.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model = _model(torch.nn.EmbeddingBag(IDS, DIM, mode="sum"))
    params = list(model.parameters())
    inner = torch.optim.Adam(params, lr=0.001)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step() -> None:
        opt.step()
        opt.zero_grad()

    rate = _train(model, step, _batches(hvd.rank(), steps), warmup)
    rates = hvd.allgather_object(rate)
    if hvd.rank() == 0:
        grad_bytes = sum(p.numel() * 4 for p in params)
        Path(out).write_text(json.dumps({"samples_per_second": sum(rates) / len(rates) * 1.0,
                                         "bytes_per_step": grad_bytes}))
    hvd.shutdown()


def tf_pss_run(servers: int, steps: int, warmup: int, out: str) -> None:
    """The tf-pss mode: this process is the coordinator and holds the in-process cluster."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    # The servers share this process's inter-op pool; with one thread per core (2 here) a worker's
    # step waiting on a ps read holds the thread the ps needs, and two concurrent steps deadlock.
    tf.config.threading.set_inter_op_parallelism_threads(8)
    spec = {"chief": [f"localhost:{_free_port()}"], "worker": [f"localhost:{_free_port()}" for _ in range(2)],
            "ps": [f"localhost:{_free_port()}" for _ in range(servers)]}
    cluster = tf.train.ClusterSpec(spec)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
    held = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", config=config, start=True)
            for job in ("worker", "ps") for i in range(len(spec[job]))]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc",
                                                                    task_type="chief", task_id=0)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        embedding = keras.layers.Embedding(IDS, DIM)
        mlp = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(64, activation="relu"),
                                keras.layers.Dense(1)])
        embedding.build((BATCH, FIELDS))
        table, dense = list(embedding.trainable_variables), list(mlp.trainable_variables)
        table_opt, dense_opt = keras.optimizers.Adagrad(0.05), keras.optimizers.Adam(0.001)
        table_opt.build(table)  # built here: a variable made inside a worker's step is not placed
        dense_opt.build(dense)

    @tf.function(input_signature=[tf.TensorSpec([BATCH, FIELDS], tf.int64), tf.TensorSpec([BATCH, 1], tf.float32)])
    def step(ids, labels):  # type: ignore[no-untyped-def]
        def replica(ids, labels):  # type: ignore[no-untyped-def]
            with tf.GradientTape() as tape:
                logits = mlp(tf.reduce_sum(embedding(ids), axis=1))
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
            grads = tape.gradient(loss, table + dense)
            table_opt.apply_gradients(zip(grads[:len(table)], table))
            dense_opt.apply_gradients(zip(grads[len(table):], dense))
            return loss

        return strategy.run(replica, args=(ids, labels))

    both = list(zip(_batches(0, steps), _batches(1, steps)))
    batches = [(tf.constant(ids), tf.constant(labels)) for pair in both for ids, labels in pair]
    for args in batches[:2 * warmup]:
        coordinator.schedule(step, args=args)
    coordinator.join()
    started = time.perf_counter()
    for args in batches[2 * warmup:]:
        last = coordinator.schedule(step, args=args)
    coordinator.join()
    rate = 2 * (steps - warmup) * BATCH / (time.perf_counter() - started)
    Path(out).write_text(json.dumps({"samples_per_second": rate, "bytes_per_step": None,
                                     "final_loss": float(last.fetch()), "tensorflow": tf.__version__,
                                     "keras": keras.__version__}))
    del held
    os._exit(0)  # the in-process servers cannot be stopped; exiting normally waits on them


def run_tf_pss(servers: int, steps: int, warmup: int, tmp: Path) -> dict[str, float]:
    out = tmp / f"tf-pss-{servers}.json"
    subprocess.run([sys.executable, __file__, "--tf-pss", str(servers), "--steps", str(steps),
                    "--warmup", str(warmup), "--out", str(out)], check=True, timeout=900)
    result: dict[str, float] = json.loads(out.read_text())
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ps(mode: str, servers: int, steps: int, warmup: int, tmp: Path) -> dict[str, float]:
    endpoints = ",".join(f"127.0.0.1:{_free_port()}" for _ in range(servers))
    base = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    base.update(UNISON_SECRET=SECRET, UNISON_PS_ENDPOINTS=endpoints, UNISON_PS_NUM_TRAINERS="2",
                UNISON_PS_MODE=mode, PYTHONPATH=str(ROOT))
    me = [sys.executable, __file__, "--trainer", mode, "--steps", str(steps), "--warmup", str(warmup)]
    procs = [subprocess.Popen(me + ["--out", "-"], env=dict(base, UNISON_PS_ROLE="server",
                                                             UNISON_PS_SERVER_INDEX=str(i)))
             for i in range(servers)]
    outs = [tmp / f"{mode}-{servers}-{t}.json" for t in range(2)]
    trainers = [subprocess.Popen(me + ["--out", str(outs[t])], env=dict(base, UNISON_PS_ROLE="trainer",
                                                                         UNISON_PS_TRAINER_ID=str(t)))
                for t in range(2)]
    for p in trainers + procs:
        if p.wait(900) != 0:
            raise SystemExit(f"a process of {mode} with {servers} servers failed")
    results = [json.loads(o.read_text()) for o in outs]
    return {"samples_per_second": sum(r["samples_per_second"] for r in results),
            "bytes_per_step": float(np.mean([r["bytes_per_step"] for r in results])),
            "unique_ids_per_step": float(np.mean([r["unique_ids_per_step"] for r in results])),
            "staleness_max": max(r["staleness_max"] for r in results),
            "server_memory_bytes": results[0]["server_memory_bytes"]}


def run_allreduce(steps: int, warmup: int, tmp: Path) -> dict[str, float]:
    out = tmp / "allreduce.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(ROOT)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "--allreduce-rank", "--steps", str(steps),
                    "--warmup", str(warmup), "--out", str(out)], env=env, check=True, timeout=900)
    result: dict[str, float] = json.loads(out.read_text())
    result["samples_per_second"] *= 2
    return result


def run_on_hosts(rounds: int, steps: int, warmup: int, rate_mbit: float, tmp: Path) -> dict[str, object]:
    """The three modes on 2 emulated hosts, in alternating rounds; each mode's runs and medians."""
    from unison.testing.hosts import EmulatedHosts, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"--hosts: {reason}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    env["PYTHONPATH"] = str(ROOT)
    modes = ["ps-async", "ps-sync", "allreduce"]
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    me = [sys.executable, __file__, "--steps", str(steps), "--warmup", str(warmup)]
    with EmulatedHosts(hosts=2, slots=1, rate_mbit=rate_mbit) as cluster:
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                load = os.getloadavg()[0]
                if mode == "allreduce":
                    out = tmp / f"allreduce-{r}.json"
                    done = cluster.run(me + ["--allreduce-rank", "--out", str(out)], env=env, timeout=900)
                    outs = [out]
                else:
                    out = tmp / f"{mode}-{r}-{{trainer}}.json"
                    done = cluster.run(me + ["--trainer", mode[3:], "--out", str(out)], timeout=900,
                                       env=dict(env, UNISON_PS_MODE=mode[3:]), unisonrun_args=["--pservers", "2"])
                    outs = [Path(str(out).replace("{trainer}", str(t))) for t in range(2)]
                if done.returncode != 0:
                    raise SystemExit(f"{mode} failed on the emulated hosts:\n{done.stderr[-3000:]}")
                results = [json.loads(o.read_text()) for o in outs]
                rate = sum(x["samples_per_second"] for x in results) * (2 if mode == "allreduce" else 1)
                row = {"load_before": load, "samples_per_second": rate,
                       "bytes_per_step": float(np.mean([x["bytes_per_step"] for x in results]))}
                runs[mode].append(row)
                print(json.dumps({"mode": mode, "round": r, **row}), flush=True)
    medians = {m: float(np.median([x["samples_per_second"] for x in rows])) for m, rows in runs.items()}
    return {"hosts": 2, "trainers_per_host": 1, "servers_per_host": 1, "rate_mbit": rate_mbit, "rounds": rounds,
            "steps": steps, "warmup": warmup, "runs": runs, "median_samples_per_second": medians,
            "async_over_allreduce": medians["ps-async"] / medians["allreduce"],
            "sync_over_allreduce": medians["ps-sync"] / medians["allreduce"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--trainer", default="")
    parser.add_argument("--allreduce-rank", action="store_true")
    parser.add_argument("--tf-pss", type=int, default=0, help="run the tf-pss mode with this many ps")
    parser.add_argument("--hosts", action="store_true", help="run on 2 emulated hosts with capped links")
    parser.add_argument("--rounds", type=int, default=3, help="--hosts: rounds of the three modes")
    parser.add_argument("--rate-mbit", type=float, default=1000.0, help="--hosts: link rate")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ps.json"))
    args = parser.parse_args()
    if args.trainer:
        trainer(args.trainer, args.steps, args.warmup, args.out)
        return
    if args.allreduce_rank:
        allreduce_trainer(args.steps, args.warmup, args.out)
        return
    if args.tf_pss:
        tf_pss_run(args.tf_pss, args.steps, args.warmup, args.out)
        return
    import tempfile

    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if args.hosts:
        with tempfile.TemporaryDirectory() as directory:
            previous["emulated_hosts"] = run_on_hosts(args.rounds, args.steps, args.warmup, args.rate_mbit,
                                                      Path(directory))
        Path(args.out).write_text(json.dumps(previous, indent=1) + "\n")
        return
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        for mode, servers in (("async", 1), ("async", 2), ("sync", 1), ("sync", 2)):
            load = os.getloadavg()[0]
            rows.append({"mode": f"ps-{mode}", "servers": servers, "load_before": load,
                         **run_ps(mode, servers, args.steps, args.warmup, tmp)})
            print(json.dumps(rows[-1]), flush=True)
        load = os.getloadavg()[0]
        rows.append({"mode": "allreduce", "servers": 0, "load_before": load,
                     **run_allreduce(args.steps, args.warmup, tmp)})
        print(json.dumps(rows[-1]), flush=True)
        for servers in (1, 2):
            load = os.getloadavg()[0]
            rows.append({"mode": "tf-pss", "servers": servers, "load_before": load,
                         **run_tf_pss(servers, args.steps, args.warmup, tmp)})
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "model": {"fields": FIELDS, "ids": IDS, "dim": DIM, "batch_per_trainer": BATCH, "trainers": 2},
        "steps": args.steps, "warmup": args.warmup, "rows": rows,
        **({"emulated_hosts": previous["emulated_hosts"]} if "emulated_hosts" in previous else {})}, indent=1) + "\n")


if __name__ == "__main__":
    main()
