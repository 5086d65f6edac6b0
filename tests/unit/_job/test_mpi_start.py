"""init() under ``mpi4py.rc.initialize = False``: unison starts MPI and finalizes only what it started.

Each case runs a script as 2 and 3 real processes under mpiexec (a fresh interpreter each: MPI starts
once per process). The script records, from an exit handler registered before unison is imported
(so it runs after unison's), whether MPI was finalized by then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
MPIEXEC = Path(sys.executable).parent / "mpiexec"

SCRIPT = r'''
import atexit, json, os, sys
mode, out = sys.argv[1], sys.argv[2]
import mpi4py
if mode != "default":
    mpi4py.rc.initialize = False
from mpi4py import MPI
if mode == "application":
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
facts = {}

def record():  # registered before unison's handlers: runs after them
    facts["finalized_at_exit"] = MPI.Is_finalized()
    with open(os.path.join(out, f"rank-{facts['rank']}.json"), "w") as f:
        json.dump(facts, f)

atexit.register(record)
facts["initialized_before_init"] = MPI.Is_initialized()
import numpy as np
import unison as hvd
hvd.init()
facts["rank"], facts["size"] = hvd.rank(), hvd.size()
facts["sum"] = float(hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)[0])
facts["threads"] = hvd.mpi_threads_supported()
hvd.shutdown()
hvd.init()  # a second job in the same process: MPI is still running
facts["sum_again"] = float(hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="again")[0])
'''


def _run(tmp_path: Path, ranks: int, mode: str, env: dict[str, str] | None = None) -> list[dict]:
    if not MPIEXEC.exists():
        pytest.skip("mpiexec not installed beside the interpreter")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, str(script), mode, str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "UNISON_START_TIMEOUT_SECONDS": "20", **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 3])
def test_init_starts_mpi_that_mpi4py_did_not_start_and_finalizes_it(tmp_path: Path, ranks: int) -> None:
    facts = _run(tmp_path, ranks, "deferred")
    total = float(sum(range(1, ranks + 1)))
    for rank, seen in enumerate(facts):
        assert seen["initialized_before_init"] is False
        assert (seen["rank"], seen["size"], seen["sum"], seen["sum_again"]) == (rank, ranks, total, ranks)
        assert seen["threads"] is True  # MPI_THREAD_MULTIPLE, as mpi4py would have asked
        assert seen["finalized_at_exit"] is True  # unison started it, unison ended it


def test_the_thread_level_follows_mpi_threads_disable(tmp_path: Path) -> None:
    facts = _run(tmp_path, 2, "deferred", {"HOROVOD_MPI_THREADS_DISABLE": "1"})
    assert [seen["threads"] for seen in facts] == [False, False]  # MPI_THREAD_SERIALIZED


@pytest.mark.parametrize("mode", ["application", "default"])
def test_an_mpi_started_by_others_is_not_finalized_by_unison(tmp_path: Path, mode: str) -> None:
    # The application's own MPI.Init_thread, or mpi4py's at import (mpi4py finalizes it after
    # Python's exit handlers): unison leaves it running.
    facts = _run(tmp_path, 2, mode)
    assert [(seen["sum"], seen["finalized_at_exit"]) for seen in facts] == [(3.0, False), (3.0, False)]
