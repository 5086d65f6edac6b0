"""Rank 1 forks a child that ends first, then ends itself with os._exit(0) mid-run:
`python _fork_exit_scenario.py VARIANT` (exit: the child calls sys.exit(0); _exit: os._exit(0); nowait:
the child runs on to the script's end, and rank 1 does not wait for it)."""

import os
import sys
import time

import numpy as np

import unison as hvd

hvd.init()
hvd.allreduce(np.ones(3), name="a")
if hvd.rank() == 1:
    variant = sys.argv[1]
    pid = os.fork()
    if pid == 0:
        if variant == "exit":
            sys.exit(0)
        if variant == "_exit":
            os._exit(0)
    else:
        if variant != "nowait":
            os.waitpid(pid, 0)
        time.sleep(0.2)
        os._exit(0)
time.sleep(3)
hvd.allreduce(np.ones(3), name="b")
