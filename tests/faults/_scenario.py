"""One rank program for the fault tests: `python _scenario.py PIDDIR MODE FAILING_RANK`.

Every rank writes its pid to PIDDIR/pid-R, then takes part in a loop of allreduces; at step 3 the
failing rank misbehaves according to MODE while the others carry on (or, for `sleeping`, sleep
outside any collective). Every rank writes PIDDIR/finally-R from its `finally:` block.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

import unison as hvd

pid_dir, mode, failing = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
try:
    for step in range(600):
        if step == 3 and rank == failing:
            if mode in ("raise", "sleeping"):
                raise ValueError(f"injected failure at step {step}")
            if mode == "sigkill":
                os.kill(os.getpid(), 9)
            if mode == "exit0":
                os._exit(0)
        if step == 3 and rank != failing and mode == "sleeping":
            time.sleep(120)  # outside any collective: only the abort's interrupt can stop this
        hvd.allreduce(np.ones(4), name=f"grad.{step % 4}")
        time.sleep(0.05)
finally:
    (pid_dir / f"finally-{rank}").write_text("ran")
