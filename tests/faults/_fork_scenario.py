"""A rank program for the fork test: `python _fork_scenario.py OUTDIR`.

After init() and one allreduce, rank 0 forks three children one after the other. Each child tries a
collective (writing the error it got to OUTDIR/child-HOW), then init() (OUTDIR/child-init-HOW), and ends: `normal` falls off the end of the
script, `exit3` calls sys.exit(3), `raise` raises. Rank 0 writes each child's exit status to
OUTDIR/status-HOW; then both ranks allreduce again and write the result to OUTDIR/after-R.
"""

import os
import sys
from pathlib import Path

import numpy as np

import unison as hvd


def child(out: Path, how: str) -> None:
    try:
        hvd.allreduce(np.ones(2), name="from.the.child")
        outcome = "no error"
    except Exception as exc:  # noqa: BLE001 - the test reads whatever came
        outcome = f"{type(exc).__name__}: {exc}"
    (out / f"child-{how}").write_text(outcome)
    try:
        hvd.init()
        outcome = "no error"
    except Exception as exc:  # noqa: BLE001
        outcome = f"{type(exc).__name__}: {exc}"
    (out / f"child-init-{how}").write_text(outcome)
    if how == "exit3":
        sys.exit(3)
    if how == "raise":
        raise ValueError("the child failed")


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    rank = hvd.rank()
    (out / f"pid-{rank}").write_text(str(os.getpid()))
    hvd.allreduce(np.ones(2), name="before")
    if rank == 0:
        for how in ("normal", "exit3", "raise"):
            pid = os.fork()
            if pid == 0:
                child(out, how)
                return  # the child ends like the script does
            _, status = os.waitpid(pid, 0)
            (out / f"status-{how}").write_text(str(os.waitstatus_to_exitcode(status)))
    result = hvd.allreduce(np.ones(2), name="after", op=hvd.Sum)
    (out / f"after-{rank}").write_text(" ".join(str(v) for v in result.tolist()))


main()
