"""One rank program for the start-up tests: `python _startup_scenario.py PIDDIR MODE`.

MODE:
- `raise`: rank 1 raises before init(); the others call init().
- `setting`: rank 1 has a setting it cannot parse (UNISON_CYCLE_TIME=abc), the others do not.
- `timeline`: every rank has UNISON_TIMELINE in a directory that does not exist (only rank 0 opens it).
- `autotune_log`: the same with UNISON_AUTOTUNE_LOG (only rank 0 writes the autotune log).
- `reinit`: both ranks init() and shut down; rank 1 then exits while rank 0 calls init() again.
Every rank that gets past its own start writes PIDDIR/pid-R; what init() raised goes to PIDDIR/caught-R.
"""

import os
import sys
import time
from pathlib import Path

pid_dir, mode = Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ.get("PMI_RANK", "0"))
(pid_dir / f"pid-{rank}").write_text(str(os.getpid()))
if mode == "raise" and rank == 1:
    raise ValueError("injected failure before init()")
if mode == "setting" and rank == 1:
    os.environ["UNISON_CYCLE_TIME"] = "abc"
if mode == "timeline":
    os.environ["UNISON_TIMELINE"] = str(pid_dir / "no-such-dir" / "timeline.json")
if mode == "autotune_log":
    os.environ["UNISON_AUTOTUNE"] = "1"
    os.environ["UNISON_AUTOTUNE_LOG"] = str(pid_dir / "no-such-dir" / "autotune.csv")

import unison as hvd  # noqa: E402

try:
    hvd.init()
    if mode == "reinit":
        hvd.shutdown()
        if rank == 1:
            sys.exit(0)
        time.sleep(0.5)
        hvd.init()
    (pid_dir / f"caught-{rank}").write_text("nothing")
except Exception as exc:
    (pid_dir / f"caught-{rank}").write_text(f"{type(exc).__name__}: {exc}")
    raise
