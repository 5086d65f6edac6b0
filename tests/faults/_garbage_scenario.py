"""One rank program: `python _garbage_scenario.py PIDDIR MODE`; rank 1 sends rank 0 one unreadable negotiation payload.

MODE `json`: the payload is not JSON; `kind`: a well-formed request of an unknown collective kind.
Every rank writes PIDDIR/pid-R, then runs allreduces; the first one after the garbage must fail on
every rank with `AbortedError` naming rank 1; each rank writes what it caught to PIDDIR/caught-R.
"""

import os
import sys
from pathlib import Path

import numpy as np

import unison as hvd
from unison.engine import cycles as engine_module

pid_dir, mode = Path(sys.argv[1]), sys.argv[2]
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
hvd.allreduce(np.ones(4), name="warmup")
if rank == 1:
    original = engine_module.encode_requests

    def garbage(requests):  # type: ignore[no-untyped-def]
        engine_module.encode_requests = original  # once
        if mode == "json":
            return b"\x00not json at all"
        return b'[{"name":"x","kind":"no-such-kind"}]'

    engine_module.encode_requests = garbage
try:
    for step in range(50):
        hvd.allreduce(np.ones(4), name=f"step.{step}")
    (pid_dir / f"caught-{rank}").write_text("nothing")
except hvd.HorovodInternalError as exc:
    (pid_dir / f"caught-{rank}").write_text(f"{type(exc).__name__}: {exc}")
    raise
