"""Throughput of TF training on 2 ranks with unison against plain MPI and against no communication.

Run: ``.venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/train_tensorflow.py [--steps 40] [--quick]
[--output PATH]``

The model is the communication-heavy MLP of the torch benchmark (1024-2048-2048-2048-512, about
11.5 M parameters, batch 32, one thread per rank). The measurements take turns step by step, each
step starting after a barrier, so that the noise of a shared machine hits all of them alike; a step's
time is the slower rank's, and medians are reported:

* ``nocomm``: the same tf.function step with a plain tape (the ceiling of any synchronous method);
* ``unison``: the step with ``hvd.DistributedGradientTape`` (one grouped allreduce per step);
* ``mpi``: a tf.function computes the gradients, NumPy copies of them are averaged in place with
  blocking mpi4py calls in 4 MiB chunks, and a second tf.function applies them: what a hand-written
  loop over the same MPI gets;
* ``raw``: unison's NumPy-level grouped allreduce of the same bytes, outside TensorFlow.

The adapter's overhead per step is ``unison - nocomm - raw``: what the TF bridge adds beyond the
computation and beyond reducing the same bytes. Rank 0 also writes everything it prints, with the
load average before and after and the share of CPU time stolen by the hypervisor (`machine.py`), to
``benchmarks/results/train_tensorflow.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402
from machine import cpu_times, percent, steal_share  # noqa: E402
from turns import average_in_place, take_turns  # noqa: E402

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
    parser.add_argument("--steps", type=int, help="timed steps per mode (default 40; 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a few steps (smoke run)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "train_tensorflow.json"))
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 40)
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

    @tf.function
    def gradients() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def apply(grads: list[tf.Tensor]) -> None:
        opt.apply_gradients(zip(grads, model.trainable_variables))

    def mpi_step() -> None:
        arrays = [np.array(g) for g in gradients()]
        for array in arrays:
            average_in_place(array)
        apply([tf.constant(a) for a in arrays])

    buffers = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]

    def raw() -> None:
        unison.grouped_allreduce(buffers, name="raw_bench")

    def updated(run: Callable[[], object]) -> Callable[[], None]:
        def timed() -> None:
            run()
            float(model.trainable_variables[0][0, 0])  # wait for the step's last update
        return timed

    runners = {"unison": updated(distributed_step), "nocomm": updated(local_step), "mpi": updated(mpi_step),
               "raw": raw}
    for run in runners.values():  # trace and warm the response cache
        run()
        run()
    times = take_turns(runners, steps)
    load, steal = os.getloadavg(), steal_share(cpu_before, cpu_times())
    if times is not None:
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"model: {params / 1e6:.2f} M params, batch {BATCH}, {hvd.size()} ranks, "
              f"{steps} steps per mode taking turns step by step (the slower rank's time)")
        for name in times:
            print(f"{name:>7}: median {med[name] * 1e3:8.1f} ms/step")
        print(f"throughput vs no-communication ceiling: unison {med['nocomm'] / med['unison']:.1%}, "
              f"plain mpi4py {med['nocomm'] / med['mpi']:.1%}")
        print(f"adapter overhead per step beyond the computation + raw allreduce: "
              f"{(med['unison'] - med['nocomm'] - med['raw']) * 1e3:.1f} ms")
        print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"CPU steal {percent(steal)}")
        results = {"ranks": hvd.size(), "threads_per_rank": 1, "alternation": "step", "steps": steps,
                   "batch_size": BATCH, "parameters": params, "load_before": load_before, "load_after": load,
                   "steal_share": steal,
                   "seconds_per_step": times, "median_seconds_per_step": med,
                   "share_of_ceiling": med["nocomm"] / med["unison"],
                   "mpi_share_of_ceiling": med["nocomm"] / med["mpi"],
                   "adapter_overhead_seconds": med["unison"] - med["nocomm"] - med["raw"]}
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
