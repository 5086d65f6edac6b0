"""A rank program for the exit-status tests: `python _statuses_program.py PIDDIR MODE`.

Every rank writes PIDDIR/pid-R, then allreduces in a loop. Modes: `exit4` (rank 1 calls sys.exit(4)
at step 3 while rank 0 waits in the next allreduce); `early` (rank 1 leaves the loop at step 3 and
exits 0 without hvd.join(), as a rank that runs out of data first); `slow` (a KeyboardInterrupt is
caught and the rank writes PIDDIR/interrupted-R, then sleeps 60 s in its handler: only a forced stop
ends it); `loop` (allreduce until stopped). Every rank writes PIDDIR/finally-R from its `finally:` block.
"""

import sys
import time
from pathlib import Path

import numpy as np

import unison

pid_dir, mode = Path(sys.argv[1]), sys.argv[2]
unison.init()
rank = unison.rank()
(pid_dir / f"pid-{rank}").write_text(str(__import__("os").getpid()))
try:
    for step in range(100000):
        if mode == "exit4" and step == 3 and rank == 1:
            sys.exit(4)
        if mode == "early" and step == 3 and rank == 1:
            break
        try:
            unison.allreduce(np.ones(4), name=f"grad.{step % 4}")
            time.sleep(0.05)
        except KeyboardInterrupt:
            if mode != "slow":
                raise
            (pid_dir / f"interrupted-{rank}").write_text("yes")
            time.sleep(60)
finally:
    (pid_dir / f"finally-{rank}").write_text("ran")
