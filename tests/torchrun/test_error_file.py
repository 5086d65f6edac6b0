"""Under torchrun the rank that failed first is the "Root Cause" torchrun names: each rank leaves
torchelastic's error file, the ranks stopped because of it one second later (real processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from unison.config import process_environment

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240),
              pytest.mark.skipif("TORCHELASTIC_ERROR_FILE" not in process_environment({"TORCHELASTIC_ERROR_FILE": "x"}),
                                 reason="unison.config.process_environment does not pass TORCHELASTIC_ERROR_FILE")]

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    import unison
    unison.init()
    rank, failing = unison.rank(), int(sys.argv[2])
    Path(sys.argv[1], f"error-file-{rank}").write_text(os.environ["TORCHELASTIC_ERROR_FILE"])
    unison.allreduce(np.ones(2), name="first")
    if rank == failing:
        time.sleep(0.5)  # the others wait in the next collective
        raise ValueError("injected failure on the failing rank")
    unison.allreduce(np.ones(2), name="second")
""")


@pytest.mark.parametrize(("n", "failing"), [(2, 1), (3, 2)])
def test_torchrun_names_the_rank_that_failed_as_the_root_cause(tmp_path: Path, n: int, failing: int) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER"))}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                           str(program), str(tmp_path), str(failing)],
                          capture_output=True, text=True, timeout=150, env=environment)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    root = output.split("Root Cause (first observed failure):", 1)[-1]
    assert re.search(rf"^\s*rank\s*: {failing} \(local_rank: {failing}\)", root, re.MULTILINE), output[-3000:]
    assert "ValueError: injected failure on the failing rank" in root, output[-3000:]
    # What each rank left: the failed rank its own error, the others the stop one second later.
    data = {rank: json.loads(Path((tmp_path / f"error-file-{rank}").read_text()).read_text()) for rank in range(n)}
    stamps = {rank: int(d["message"]["extraInfo"]["timestamp"]) for rank, d in data.items()}
    assert data[failing]["message"]["message"] == "ValueError: injected failure on the failing rank"
    for rank in set(range(n)) - {failing}:
        assert data[rank]["message"]["message"].startswith(f"AbortedError: rank {failing} ("), data[rank]
        assert stamps[rank] > stamps[failing], stamps
