"""Every rank raises, rank 0 a moment after rank 1, and each prints its error through an application
hook that is slow to finish (a big report): rank 1's abort arrives while rank 0 still prints.

`python _slow_report_scenario.py PIDDIR`; each rank writes PIDDIR/pid-R.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np


def slow_hook(exc_type, exc, tb):  # the application's own hook, installed before unison's
    sys.stderr.write(f"BEGIN REPORT of {exc}\n")
    sys.stderr.flush()
    time.sleep(1.5)
    sys.stderr.write(f"END REPORT of {exc}\n")
    sys.stderr.flush()


sys.excepthook = slow_hook
import unison as hvd  # noqa: E402 - after the application's hook, which unison chains

hvd.init()
(Path(sys.argv[1]) / f"pid-{hvd.rank()}").write_text(str(os.getpid()))
hvd.allreduce(np.ones(2), name="a")
if hvd.rank() == 1:
    raise ValueError("rank 1 fails first")
time.sleep(0.5)
raise ValueError(f"rank {hvd.rank()} fails second")
