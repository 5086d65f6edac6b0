"""One process that meets others through init_process_group("unison", ...) and reports how it went.

``python _meet.py INIT_METHOD RANK WORLD_SIZE TIMEOUT_SECONDS [twice|probe]``: prints ``joined R of N`` or
the error's type and message, then whether unison is initialized in this process; exits 0 or 1. ``twice``
calls init_process_group a second time; ``probe`` prints what ``hvd.mpi_threads_supported()`` says.
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
    if "probe" in sys.argv[5:]:
        try:
            print(f"mpi_threads_supported: {hvd.mpi_threads_supported()}", flush=True)
        except ValueError as exc:
            print(f"mpi_threads_supported: ValueError: {exc}", flush=True)
        print(f"gloo_enabled: {hvd.gloo_enabled()} mpi_enabled: {hvd.mpi_enabled()}", flush=True)
    dist.barrier()
    code = 0
except Exception as exc:  # noqa: BLE001 - reported for the test
    print(f"error after {time.monotonic() - began:.1f} s: {type(exc).__name__}: {exc}", flush=True)
    code = 1
print(f"initialized={hvd.is_initialized()}", flush=True)
sys.exit(code)
