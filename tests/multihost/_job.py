"""The program every rank of a multi-host test runs: topology, collectives, and optional checks, as one JSON line.

Environment: ``MULTIHOST_OUTSIDER=ADDRESS`` makes the last rank start a process outside the job that
calls the coordinator service at ADDRESS with a wrong secret, then with none, then with the right one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

import unison as hvd


def outsider(address: str) -> dict[str, object]:
    """Call the service's Status from a fresh process that is not a rank, with several secrets."""
    outcome = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "UNISON_SECRET", "HYDRA"))}
    for label, secret in (("wrong", "0" * 64), ("none", None), ("right", os.environ["UNISON_SECRET"])):
        call_env = dict(env, **({"UNISON_SECRET": secret} if secret else {}))
        done = subprocess.run([sys.executable, "-m", "unison.status", address], env=call_env,
                              capture_output=True, text=True, timeout=30)
        outcome[label] = [done.returncode, (done.stdout + done.stderr).strip()[:300]]
    return outcome


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result: dict[str, object] = {
        "rank": rank, "size": size, "host": socket.gethostname(),
        "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
        "homogeneous": hvd.is_homogeneous(),
    }
    # Integer-valued floats: every summation order gives the same bits, so flat and hierarchical
    # allreduce must agree exactly. 3 MiB spans chunks (UNISON_CHUNK_BYTES=1048576 in the tests).
    big = (np.arange(786432, dtype=np.float32) % 1000) * (rank + 1)
    summed = hvd.allreduce(big, op=hvd.Sum, name="big")
    small = [hvd.allreduce(np.full(3, rank + i, dtype=np.int64), op=hvd.Sum, name=f"s{i}") for i in range(4)]
    average = hvd.allreduce(np.full(2, float(rank), dtype=np.float64), op=hvd.Average, name="avg")
    gathered = hvd.allgather(np.full((rank + 1, 2), rank, dtype=np.int32), name="gather")
    broadcast = hvd.broadcast(np.arange(4, dtype=np.float32) + rank, root_rank=size - 1, name="bcast")
    hosts = hvd.allgather_object(socket.gethostname())
    result.update(
        big_checksum=float(summed.astype(np.float64).sum()), big_head=summed[:3].tolist(),
        big_expected=float(((np.arange(786432) % 1000).sum()) * size * (size + 1) / 2),
        small=[s.tolist() for s in small], average=average.tolist(), gathered=gathered[:, 0].tolist(),
        broadcast=broadcast.tolist(), hosts=hosts,
    )
    backend = hvd._job.runtime.job().engine.backend
    result["backend"] = repr(backend)
    result["hierarchical_calls"] = backend.statistics().get("hierarchical_calls", 0)
    address = os.environ.get("MULTIHOST_OUTSIDER")
    if address and rank == size - 1:
        result["outsider"] = outsider(address)
    hvd.barrier()
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
