"""What a rank asks about its job under torchrun: it met at torch's store and runs on gloo, without MPI, and
``mpi_threads_supported()`` says so instead of calling a 2-process job a single process (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

PROGRAM = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import unison.torch as hvd
    hvd.init()
    try:
        threads = f"returned {hvd.mpi_threads_supported()}"
    except ValueError as exc:
        threads = f"ValueError: {exc}"
    facts = {"size": hvd.size(), "mpi": hvd.mpi_enabled(), "gloo": hvd.gloo_enabled(), "threads": threads}
    Path(sys.argv[1], f"facts-{hvd.rank()}").write_text(json.dumps(facts))
    hvd.shutdown()
""")


def test_mpi_threads_supported_under_torchrun_says_the_job_runs_without_mpi(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(program), str(tmp_path)], capture_output=True, text=True, timeout=150, env=environment)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for rank in range(2):
        facts = json.loads((tmp_path / f"facts-{rank}").read_text())
        assert (facts["size"], facts["mpi"], facts["gloo"]) == (2, False, True), facts
        # Horovod raises ValueError here too when MPI is not enabled; the message says what the job is.
        assert facts["threads"] == ("ValueError: MPI is not in use in this job: its 2 processes met at a torch store "
                                    "and run on gloo. mpi_threads_supported() is about MPI's thread level, which only "
                                    "a job launched by unisonrun or mpiexec has."), facts
