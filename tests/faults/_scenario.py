"""One rank program for the fault tests: `python _scenario.py PIDDIR MODE FAILING_RANK`.

Every rank writes its pid to PIDDIR/pid-R, then takes part in a loop of allreduces; at step 3 the
failing rank misbehaves according to MODE while the others carry on (or, for `sleeping`, sleep
outside any collective). Every rank writes PIDDIR/finally-R from its `finally:` block.

Modes: raise, sigkill, exit0, sleeping (above); stuck (the failing rank sleeps in its own code, so
the others stall); stuck_in_c (the same, but it ignores SIGINT and, once its engine has stopped,
holds the GIL in a C call, so neither an interrupt nor a timer thread can end it); frozen (the
failing rank stops itself with SIGSTOP); metric (the failing rank alone calls an unnamed allreduce
and waits in it, while the others wait in the next named one: a deadlock). With FAULT_GIVE_UP_SECONDS=S, the other ranks' engines stop
waiting for their peers S seconds after step 3 (`MpiBackend.fail_waits`), as a detector of a lost
peer would.
"""

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

import unison as hvd
from unison._job import runtime as _runtime

pid_dir, mode, failing = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
give_up = float(os.environ.get("FAULT_GIVE_UP_SECONDS", "0"))
hvd.init()
rank = hvd.rank()
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))


def give_up_later() -> None:
    time.sleep(give_up)
    _runtime.job().engine.backend.fail_waits(f"rank {failing} stopped answering (given up after {give_up} s)")


try:
    for step in range(600):
        if step == 3 and rank == failing:
            if mode in ("raise", "sleeping"):
                raise ValueError(f"injected failure at step {step}")
            if mode == "sigkill":
                os.kill(os.getpid(), 9)
            if mode == "exit0":
                os._exit(0)
            if mode == "stuck":
                time.sleep(120)
            if mode == "stuck_in_c":
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                while _runtime.job().engine.state == "running":
                    time.sleep(0.05)
                ctypes.PyDLL(None).sleep(120)  # PyDLL keeps the GIL during the call
            if mode == "frozen":
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "metric":
                hvd.allreduce(np.ones(1))  # a metric on this rank only
        if step == 3 and rank != failing:
            if mode == "sleeping":
                time.sleep(120)  # outside any collective: only the abort's interrupt can stop this
            if give_up:
                threading.Thread(target=give_up_later, daemon=True).start()
        hvd.allreduce(np.ones(4), name=f"grad.{step % 4}")
        time.sleep(0.05)
finally:
    (pid_dir / f"finally-{rank}").write_text("ran")
