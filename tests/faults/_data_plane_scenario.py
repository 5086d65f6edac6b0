"""One rank program: `python _data_plane_scenario.py PIDDIR [MODE]`; a rank does not join a data-plane call at once.

The negotiation has shown every rank ready, so rank 0 enters MPI's allreduce (an alltoall in
``uneven``). Every rank writes PIDDIR/pid-R first. MODE:
- ``refused`` (the default): on rank 1 alone the executor raises before the transport is reached (as a
  buffer MPI refuses would), the error reaches its caller, which catches it and goes on to its next
  collective; rank 0's call can never complete.
- ``frozen``: rank 1 stops itself (SIGSTOP) inside the call; rank 0 is blocked in MPI's allreduce with
  a peer that will never come.
- ``slow``: rank 1 reaches the transport SLOW_SECONDS late (busy, alive, outside any control
  exchange), and the job completes.
- ``late-refused`` and ``late-frozen``: rank 1 is busy SLOW_SECONDS first (alive, outside any control
  exchange, so a first look at it finds nothing wrong), then as ``refused`` or ``frozen``.
- ``uneven`` (3 ranks): rank 2 reaches an alltoall LATE_SECONDS late (past the peer timeout and the
  probes after it) and sends rank 1 nothing, so rank 1 completes its part and waits in its next
  cycle's control exchange while rank 0 still waits for rank 2; the job completes.
"""

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import unison as hvd
from unison._job import runtime as _runtime

pid_dir = Path(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "refused"
SLOW_SECONDS = 5.0
LATE_SECONDS = 9.0
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
hvd.allreduce(np.ones(4), name="warmup")
if rank == 1:
    backend = _runtime.job().engine.backend
    allreduce_ = backend.allreduce_

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise BufferError("injected: the transport refused this rank's buffer")

    def frozen(*args, **kwargs):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGSTOP)

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(SLOW_SECONDS)
        allreduce_(*args, **kwargs)

    def late(fault):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(SLOW_SECONDS)
            fault(*args, **kwargs)
        return call

    injected = {"refused": refused, "frozen": frozen, "slow": slow,
                "late-refused": late(refused), "late-frozen": late(frozen)}.get(mode)
    if injected is not None:
        backend.allreduce_ = injected
if mode == "uneven":
    if rank == 2:
        backend = _runtime.job().engine.backend
        alltoallv = backend.alltoallv

        def late(*args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(LATE_SECONDS)
            alltoallv(*args, **kwargs)

        backend.alltoallv = late
    splits = np.array([1, 0, 1]) if rank == 2 else np.array([1, 1, 1])
    _, received = hvd.alltoall(np.full((int(splits.sum()), 2), float(rank)), splits=splits, name="uneven")
    assert received.tolist() == ([1, 1, 1] if rank != 1 else [1, 1, 0]), received
    print(f"rank {rank} alltoall done", flush=True)
try:
    hvd.allreduce(np.ones(1 << 10), name="refused")
except Exception as exc:  # noqa: BLE001 - a program that catches the failure and goes on
    print(f"rank {rank} caught {type(exc).__name__}: {exc}", flush=True)
hvd.allreduce(np.ones(4), name="next")
print(f"rank {rank} finished", flush=True)
