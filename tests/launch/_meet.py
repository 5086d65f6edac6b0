"""One process that meets others through init_process_group("unison", ...) and reports how it went.

``python _meet.py INIT_METHOD RANK WORLD_SIZE TIMEOUT_SECONDS [twice]``: prints ``joined R of N`` or the
error's type and message, then whether unison is initialized in this process; exits 0 or 1.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch.distributed as dist

import unison.torch as hvd

init_method, rank, size, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
began = time.monotonic()
try:
    dist.init_process_group("unison", init_method=init_method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=seconds))
    print(f"joined {hvd.rank()} of {hvd.size()}", flush=True)
    if "twice" in sys.argv[5:]:
        dist.init_process_group("unison", init_method=init_method, rank=rank, world_size=size)
    dist.barrier()
    code = 0
except Exception as exc:  # noqa: BLE001 - reported for the test
    print(f"error after {time.monotonic() - began:.1f} s: {type(exc).__name__}: {exc}", flush=True)
    code = 1
print(f"initialized={hvd.is_initialized()}", flush=True)
sys.exit(code)
