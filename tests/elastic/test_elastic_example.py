"""examples/pytorch_elastic_digits.py does what its docstring says, run with the docstring's own commands."""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch_elastic_digits.py"


def docstring_commands() -> str:
    """The shell commands of the example's docstring (the indented block after "Run")."""
    text = ast.get_docstring(ast.parse(EXAMPLE.read_text())) or ""
    block = text.split("lines will do):", 1)[1].split("\n\n")[1]
    return "\n".join(line.strip() for line in block.splitlines())


def test_the_docstrings_run_loses_rank_1_and_goes_on_with_the_third_host(tmp_path: Path) -> None:
    commands = docstring_commands()
    assert commands.startswith("printf 'localhost:1\\n127.0.0.1:1\\n%s:1\\n' \"$(hostname)\" > hosts.txt")
    run = (commands.replace("unisonrun ", f"{sys.executable} -m unison.launcher ")
           .replace("python examples/", f"{sys.executable} {EXAMPLE.parent}/") + " --epochs 1")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "HOROVOD_"))}
    done = subprocess.run(["bash", "-c", run], cwd=tmp_path, capture_output=True, text=True, timeout=220, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "unisonrun: elastic: epoch 0: 2 ranks on localhost:1,127.0.0.1:1" in out
    assert re.search(r"unisonrun: rank 1 \(127\.0\.0\.1, pid \d+\) ended without shutting unison down \(killed by "
                     r"signal 9 \(SIGKILL\)\)", out), out
    assert "blacklisting 127.0.0.1 for good (rank 1 failed)" in out
    assert f"unisonrun: elastic: epoch 1: 2 ranks on localhost:1,{socket.gethostname()}:1" in out
    # Killed after 20 of epoch 0's 29 steps: the relaunch finishes that epoch, 29 steps in all.
    assert re.search(r"^epoch 0: accuracy 0\.\d+ on 2 ranks, 29 steps so far$", done.stdout, re.MULTILINE), out
