"""An elastic training job for the tests: exact arithmetic, so the committed state is checked bit for bit.

Each sample i has an integer feature vector; a step sums the features of the global batch's samples
(an allreduce of integers held in float64: exact in any order), feeds the sum as the gradient of an
SGD-with-momentum step, records the batch in an ElasticSampler and in ``state.history``, and commits.
Replaying ``history`` from zeros in one process must give the committed model and momentum bit for
bit, and the history must hold every sample index exactly once per epoch.

Environment: ``ELASTIC_OUT`` (directory for results and progress), ``ELASTIC_SAMPLES``,
``ELASTIC_EPOCHS``, ``ELASTIC_STEP_SECONDS``, ``ELASTIC_KILL=COMMIT:RANK`` (that rank SIGKILLs itself
before the allreduce of the step after that commit, once per job), ``ELASTIC_RAISE=COMMIT:RANK``,
``ELASTIC_KILL_DURING=COMMIT:RANK`` (in the first launch, every rank starts a 32 MiB allreduce after
that commit and that rank SIGKILLs itself ``ELASTIC_KILL_DELAY`` seconds into it; each rank writes
``padding-<rank>-started`` before it and ``padding-<rank>-finished`` if it ever returns). ``ELASTIC_FINALLY_SECONDS=S``: every rank's
``finally:`` block around the training sleeps S seconds, then writes ``finally-<launch>-<rank>``.
Every rank writes ``segments-<launch>-<rank>``: the MPICH shared-memory segments it maps.

Every rank writes ``pid-<launch>-<rank>`` (its pid) when it starts; ``<launch>`` is the membership epoch the
process started in (a worker of the elastic driver keeps its process across epochs; a relaunched job starts
every process anew), and each result carries the pid that wrote it.

``ELASTIC_HOROVOD_STYLE=1`` trains as Horovod's own elastic scripts do: the state also keeps a
``commits`` counter of the script's own (counting down: 1000 minus the committed steps), a ``batch``
index that goes on across resets and is what ``record_batch`` gets, and a value of every name the
State once used for its own bookkeeping (`FORMER_INTERNAL_NAMES`), each set to ``[name, steps]``.
Rank 0 writes ``restored-<epoch>`` (the committed steps each membership epoch starts from) and
``committed-<epoch>`` (after each of its commits), and the progress file counts steps, not commits.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch

import unison.torch as hvd

BATCH = 2
FEATURES = 4
# Every name a State kept as an attribute of its own before its bookkeeping moved apart from the
# user's values (tests/unit/elastic/test_states.py has the same list).
FORMER_INTERNAL_NAMES = ("commits", "_bcast_object", "_get_rank", "_reset_callbacks", "_known_updates",
                         "_driver_updates", "_asked_at", "_pending_check", "_checked", "_saved", "_saved_in_store",
                         "_background_commits", "_writer", "_write_error", "_writer_store", "_names")


def features(index: int) -> list[float]:
    return [float(index % 7), float(index % 5), 1.0, float(index % 3)]


def model_and_optimizer() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    model = torch.nn.Linear(FEATURES, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)


def apply_step(model: torch.nn.Linear, optimizer: torch.optim.SGD, gradient: torch.Tensor) -> None:
    model.weight.grad = gradient.view_as(model.weight).clone()
    optimizer.step()


def replay(history: list[tuple[int, list[int]]]) -> tuple[str, str]:
    """The weight and momentum (hex of their bytes) after replaying `history` in one process."""
    model, optimizer = model_and_optimizer()
    for _, indices in history:
        gradient = torch.tensor([sum(features(i)[k] for i in indices) for k in range(FEATURES)],
                                dtype=torch.float64)
        apply_step(model, optimizer, gradient)
    return digest(model, optimizer)


def digest(model: torch.nn.Linear, optimizer: torch.optim.SGD) -> tuple[str, str]:
    momentum = optimizer.state[model.weight].get("momentum_buffer")
    return (model.weight.detach().numpy().tobytes().hex(),
            momentum.numpy().tobytes().hex() if momentum is not None else "")


def _trigger(variable: str, commits: int, rank: int, out: Path) -> bool:
    spec = os.environ.get(variable, "")
    if not spec:
        return False
    at_commit, at_rank = (int(x) for x in spec.split(":"))
    done = out / f"{variable.lower()}-done"
    if commits == at_commit and rank == at_rank and not done.exists():
        done.write_text(str(os.getpid()))
        return True
    return False


def _allreduce_while_killed(commits: int, out: Path) -> None:
    """The failure in mid-allreduce of ``ELASTIC_KILL_DURING`` (first launch only, at its commit)."""
    spec = os.environ.get("ELASTIC_KILL_DURING", "")
    if not spec or os.environ.get("UNISON_ELASTIC_EPOCH", "0") != "0":
        return
    at_commit, at_rank = (int(x) for x in spec.split(":"))
    if commits != at_commit:
        return
    rank = hvd.rank()
    if rank == at_rank:
        delay = float(os.environ.get("ELASTIC_KILL_DELAY", "0.5"))
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        (out / "elastic_kill_during-done").write_text(str(os.getpid()))
    (out / f"padding-{rank}-started").write_text(str(time.time()))
    hvd.allreduce(torch.ones(4 << 20, dtype=torch.float64), op=hvd.Sum, name="padding")
    (out / f"padding-{rank}-finished").write_text(str(time.time()))


def record_segments(out: Path, launch: str) -> None:
    """Write which MPICH shared-memory segments this rank maps (``segments-<launch>-<rank>``)."""
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line})
    (out / f"segments-{launch}-{hvd.rank()}").write_text("\n".join(mapped))


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test's ranks can be asked where they are
    hvd.init()
    out = Path(os.environ["ELASTIC_OUT"])
    samples = int(os.environ.get("ELASTIC_SAMPLES", "24"))
    epochs = int(os.environ.get("ELASTIC_EPOCHS", "2"))
    pause = float(os.environ.get("ELASTIC_STEP_SECONDS", "0.05"))
    model, optimizer = model_and_optimizer()
    sampler = hvd.elastic.ElasticSampler(list(range(samples)), shuffle=True, seed=7)
    horovod_style = os.environ.get("ELASTIC_HOROVOD_STYLE") == "1"
    extra = ({name: [name, 0] for name in FORMER_INTERNAL_NAMES} | {"commits": 1000, "batch": 0}
             if horovod_style else {})
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, history=[], **extra)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    launch = os.environ.get("UNISON_ELASTIC_EPOCH", "0")
    record_segments(out, launch)
    (out / f"pid-{launch}-{hvd.rank()}").write_text(str(os.getpid()))

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        epoch_now = os.environ.get("UNISON_ELASTIC_EPOCH", "0")  # the epoch this process is in now
        if horovod_style and hvd.rank() == 0:
            (out / f"restored-{epoch_now}").write_text(str(len(state.history)))
        while state.epoch < epochs:
            s = state.train_sampler
            local = list(iter(s))
            for batch in range(len(local) // BATCH + (len(local) % BATCH > 0)):
                positions = range(batch * BATCH, min((batch + 1) * BATCH, len(local)))
                real = [local[k] for k in positions if k * s.num_replicas + s.rank < len(s.remaining_indices)]
                contribution = torch.tensor([sum(features(i)[k] for i in real) for k in range(FEATURES)],
                                            dtype=torch.float64)
                if _trigger("ELASTIC_KILL", state.statistics()["commits"], hvd.rank(), out):
                    os.kill(os.getpid(), signal.SIGKILL)
                if _trigger("ELASTIC_RAISE", state.statistics()["commits"], hvd.rank(), out):
                    raise RuntimeError("injected failure")
                _allreduce_while_killed(state.statistics()["commits"], out)
                gradient = hvd.allreduce(contribution, op=hvd.Sum, name="gradient")
                apply_step(state.model, state.optimizer, gradient)
                seen = sorted(i for part in hvd.allgather_object(real, name="seen") for i in part)
                state.history.append((state.epoch, seen))
                if horovod_style:  # the batch index goes on across resets, as in Horovod's scripts
                    s.record_batch(state.batch, BATCH)
                    state.batch += 1
                    state.commits = 1000 - len(state.history)
                    for name in FORMER_INTERNAL_NAMES[1:]:
                        setattr(state, name, [name, len(state.history)])
                else:
                    s.record_batch(batch, BATCH)
                state.commit()
                if hvd.rank() == 0:
                    done = len(state.history) if horovod_style else state.statistics()["commits"]
                    (out / "progress").write_text(f"{done} {hvd.size()}")
                    if horovod_style:
                        (out / f"committed-{epoch_now}").write_text(str(len(state.history)))
                time.sleep(pause)
            state.epoch += 1
            if horovod_style:
                state.batch = 0
            s.set_epoch(state.epoch)
            state.commit()

    try:
        train(state)
    finally:
        if os.environ.get("ELASTIC_FINALLY_SECONDS"):  # a slow finally: block on every rank
            time.sleep(float(os.environ["ELASTIC_FINALLY_SECONDS"]))
            (out / f"finally-{launch}-{hvd.rank()}").write_text("ran")
    weight, momentum = digest(state.model, state.optimizer)
    result = {"rank": hvd.rank(), "size": hvd.size(), "epoch": int(launch), "pid": os.getpid(),
              "last_epoch": int(os.environ.get("UNISON_ELASTIC_EPOCH", "0")),
              "commits": state.statistics()["commits"], "history": state.history, "weight": weight,
              "momentum": momentum, "resets": resets, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "values": {name: getattr(state, name) for name in extra}}
    (out / f"result-{hvd.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
