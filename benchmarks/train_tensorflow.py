"""Throughput of TF training on 2 ranks with unison against the same processes without communication.

Run: ``.venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/train_tensorflow.py [--rounds 5 --steps 10]
[--quick] [--output PATH]``

The model is the communication-heavy MLP of the torch benchmark (1024-2048-2048-2048-512, about
11.5 M parameters, batch 32, one thread per rank). Rounds alternate between three measurements, so
that load changes on a shared machine hit all of them alike; medians are reported:

* ``nocomm``: the same tf.function step with a plain tape (the ceiling);
* ``sync``: ``nocomm`` plus an MPI barrier after every step: the ceiling of any synchronous method,
  since a step then lasts as long as the slower rank's;
* ``unison``: the step with ``hvd.DistributedGradientTape`` (one grouped allreduce per step);
* ``raw``: unison's NumPy-level grouped allreduce of the same bytes, outside TensorFlow.

The adapter's overhead per step is ``unison - sync - raw``: what the TF bridge adds beyond computing
in lockstep and beyond reducing the same bytes. Rank 0 also writes everything it prints, with the
load average before and after and the share of CPU time stolen by the hypervisor (`machine.py`), to
``benchmarks/results/train_tensorflow.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402
from machine import cpu_times, percent, steal_share  # noqa: E402
from mpi4py import MPI  # noqa: E402

import unison  # noqa: E402
import unison.tensorflow as hvd  # noqa: E402

LAYERS = [1024, 2048, 2048, 2048, 512]
BATCH = 32


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((LAYERS[0],))]
    layers += [keras.layers.Dense(width, activation="relu") for width in LAYERS[1:-1]]
    layers.append(keras.layers.Dense(LAYERS[-1]))
    return keras.Sequential(layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 10; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="one round of a few steps (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "train_tensorflow.json"))
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    steps_per_run = args.steps or (2 if args.quick else 10)
    hvd.init()
    load_before, cpu_before = os.getloadavg(), cpu_times()
    model = make_model()
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    opt = keras.optimizers.SGD(0.001)
    x = tf.random.normal([BATCH, LAYERS[0]], seed=hvd.rank())
    y = tf.random.normal([BATCH, LAYERS[-1]], seed=hvd.rank())

    def step(distributed: bool) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def distributed_step() -> None:
        step(True)

    @tf.function
    def local_step() -> None:
        step(False)

    steps = {"unison": distributed_step, "nocomm": local_step}
    buffers = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]

    def raw() -> None:
        unison.grouped_allreduce(buffers, name="raw_bench")

    def synced() -> None:
        local_step()
        MPI.COMM_WORLD.Barrier()

    runners = {"unison": steps["unison"], "nocomm": steps["nocomm"], "sync": synced, "raw": raw}
    for run in runners.values():  # trace and warm the response cache
        run()
        run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            unison.barrier()
            start = time.perf_counter()
            for _ in range(steps_per_run):
                run()
            if name != "raw":
                float(model.trainable_variables[0][0, 0])  # wait for the last step
            times[name].append((time.perf_counter() - start) / steps_per_run)
    load, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if hvd.rank() == 0:
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"model: {params / 1e6:.2f} M params, batch {BATCH}, {hvd.size()} ranks, "
              f"{rounds} rounds x {steps_per_run} steps")
        for name in runners:
            print(f"{name:>7}: median {med[name] * 1e3:8.1f} ms/step  "
                  f"(rounds: {', '.join(f'{t * 1e3:.1f}' for t in times[name])})")
        print(f"throughput vs no-communication ceiling: {med['nocomm'] / med['unison']:.1%}; "
              f"vs synchronous ceiling: {med['sync'] / med['unison']:.1%} "
              f"(sync is {med['nocomm'] / med['sync']:.0%} of no-comm)")
        print(f"adapter overhead per step beyond lockstep compute + raw allreduce: "
              f"{(med['unison'] - med['sync'] - med['raw']) * 1e3:.1f} ms")
        print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"CPU steal {percent(steal)}")
        results = {"ranks": hvd.size(), "threads_per_rank": 1, "rounds": rounds, "steps": steps_per_run,
                   "batch_size": BATCH, "parameters": params, "load_before": load_before, "load_after": load,
                   "steal_share": steal,
                   "seconds_per_step": times, "median_seconds_per_step": med,
                   "share_of_ceiling": med["nocomm"] / med["unison"],
                   "share_of_sync_ceiling": med["sync"] / med["unison"],
                   "sync_share_of_ceiling": med["nocomm"] / med["sync"],
                   "adapter_overhead_seconds": med["unison"] - med["sync"] - med["raw"]}
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
