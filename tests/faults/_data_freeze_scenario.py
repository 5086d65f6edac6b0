"""One rank program: `python _data_freeze_scenario.py PIDDIR`; rank 1 freezes (SIGSTOP) inside a data-plane call.

The negotiation has shown both ranks ready, so rank 0 is blocked in MPI's allreduce with a peer that
will never come. Every rank writes PIDDIR/pid-R first.
"""

import os
import signal
import sys
from pathlib import Path

import numpy as np

import unison as hvd
from unison._job import runtime as _runtime

pid_dir = Path(sys.argv[1])
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
hvd.allreduce(np.ones(4), name="warmup")
if rank == 1:
    backend = _runtime.job().engine.backend

    def frozen_allreduce(*args, **kwargs):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGSTOP)

    backend.allreduce_ = frozen_allreduce
hvd.allreduce(np.ones(1 << 20), name="large")
