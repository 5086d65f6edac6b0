"""One rank program: `python _interrupt_scenario.py PIDDIR`; both ranks call one cached allreduce in a loop.

Every rank writes PIDDIR/pid-R, then PIDDIR/looping-R once its calls run from the cache (each call's
cycle on the main thread: `Engine.run_now`), and loops until interrupted. What each rank caught goes to
PIDDIR/caught-R: the test sends SIGINT to rank 0 alone, so rank 0 must catch its own
KeyboardInterrupt and rank 1 an error naming rank 0, never an engine that died half way through a cycle.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

import unison as hvd

pid_dir = Path(sys.argv[1])
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
x = np.ones(1024, dtype=np.float32)
caught = "nothing"
try:
    for step in range(10_000_000):
        hvd.allreduce(x, name="loop", op=hvd.Sum)
        if step == 100:
            (pid_dir / f"looping-{rank}").write_text("yes")
    time.sleep(60)
except BaseException as exc:
    caught = f"{type(exc).__name__}: {exc}"
    raise
finally:
    (pid_dir / f"caught-{rank}").write_text(caught)
