"""Ranks that keep completing collectives while one collective stays pending are no deadlock:
`python _progress_scenario.py MODE SECONDS`.

Modes (each for SECONDS, well past UNISON_DEADLOCK_SECONDS):
- set (3 ranks): rank 2 waits in a global allreduce while ranks 0 and 1 loop an allreduce in their
  own process set, then call the global one too;
- async (2 ranks or more): rank 0 starts an asynchronous allreduce the others have yet to call, every
  rank loops another allreduce, then the others call the first one and rank 0 waits for it.
Each detail cycle sees the looping ranks' main threads blocked in unison, in a new wait each time.
Every rank checks its results and prints ``rank R: ok, N calls``.
- stall (3 ranks): as ``set``, but ranks 0 and 1 loop until the stall inspector stops the job (its
  limits come from the environment): the stop reaches them inside their own calls' cycles.
"""

import sys
import time

import numpy as np

import unison as hvd

mode, seconds = sys.argv[1], float(sys.argv[2])
hvd.init(process_sets="dynamic")
rank, size = hvd.rank(), hvd.size()


def mine() -> np.ndarray:
    return np.arange(4, dtype=np.float64) + rank


def expected(ranks: range | list[int]) -> np.ndarray:
    return sum(np.arange(4, dtype=np.float64) + r for r in ranks)


calls = 0
if mode in ("set", "stall"):
    pair = hvd.add_process_set([0, 1])
    for _ in range(3):  # every call seen once, so that the loop below runs in the steady state
        if rank < 2:
            hvd.allreduce(mine(), name="pair", op=hvd.Sum, process_set=pair)
        hvd.allreduce(mine(), name="all", op=hvd.Sum)
    if rank < 2:
        start = time.monotonic()
        while mode == "stall" or time.monotonic() - start < seconds:
            got = hvd.allreduce(mine(), name="pair", op=hvd.Sum, process_set=pair)
            assert np.array_equal(got, expected([0, 1])), got
            calls += 1
        hvd.barrier(process_set=pair)
    assert np.array_equal(hvd.allreduce(mine(), name="all", op=hvd.Sum), expected(range(size)))
elif mode == "async":
    for _ in range(3):
        hvd.allreduce(mine(), name="loop", op=hvd.Sum)
        hvd.allreduce(mine(), name="late", op=hvd.Sum)
    late = hvd.allreduce_async(mine(), name="late", op=hvd.Sum) if rank == 0 else None
    # the same number of calls on every rank: rank 0 decides how many the time allows
    start = time.monotonic()
    while True:
        go_on = np.array([1.0 if rank != 0 or time.monotonic() - start < seconds else 0.0])
        if not hvd.allreduce(go_on, name="go_on", op=hvd.Min)[0]:
            break
        got = hvd.allreduce(mine(), name="loop", op=hvd.Sum)
        assert np.array_equal(got, expected(range(size))), got
        calls += 1
    result = hvd.synchronize(late) if rank == 0 else hvd.allreduce(mine(), name="late", op=hvd.Sum)
    assert np.array_equal(result, expected(range(size))), result
else:
    raise SystemExit(f"unknown mode {mode!r}")
print(f"rank {rank}: ok, {calls} calls", flush=True)
hvd.shutdown()
