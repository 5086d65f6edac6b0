"""Run one rank of a multi-rank job with its output in LOGDIR/rank-<r>.log and its exit status beside it.

Usage (under mpiexec; `unison.testing.run` starts it): python -m unison.testing._rank_wrapper LOGDIR
-m MODULE [ARGS...]

The rank comes from the launcher's environment (PMI_RANK for MPICH, OMPI_COMM_WORLD_RANK for Open
MPI, PMIX_RANK for PMIx launchers, RANK for torchrun). Besides redirecting output, the wrapper writes the module's exit
status to LOGDIR/rank-<r>.exit (absent if the process was killed) and dumps every thread's stack to
the log on SIGTERM (sent by mpiexec when the runner terminates the job) until the module takes over
the signal (the pytest plugin does, for SIGUSR1 too).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import runpy
import signal
import sys
import traceback

_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK")  # RANK: torchrun's


def _rank() -> int:
    for variable in _RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None:
            return int(value)
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit(f"usage: {sys.argv[0]} LOGDIR -m MODULE [ARGS...]")
    logdir, module, args = sys.argv[1], sys.argv[3], sys.argv[4:]
    rank = _rank()
    log = os.open(os.path.join(logdir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # pytest points fds 1 and 2 elsewhere while it captures a test's output; stack dumps go to a
    # descriptor of their own so they reach the log even from the middle of a hung test.
    dumps = os.fdopen(os.dup(2), "w")
    atexit.register(dumps.close)  # open until exit on purpose: faulthandler writes to it
    faulthandler.register(signal.SIGTERM, file=dumps, all_threads=True, chain=True)

    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    with open(os.path.join(logdir, f"rank-{rank}.exit"), "w") as exit_file:
        exit_file.write(f"{status}\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
