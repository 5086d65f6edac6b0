"""The NumPy digits example: data-parallel training matches one process on the global batch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def run(processes: int) -> str:
    command = [sys.executable, str(ROOT / "examples" / "numpy_digits.py"), "--steps", "40"]
    if processes > 1:
        command = [str(MPIEXEC), "-n", str(processes), *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"loss (\d+\.\d+)", output)]


def test_two_ranks_follow_the_single_process_trajectory() -> None:
    single, double = run(1), run(2)
    assert "weights identical on all 2 ranks" in double
    assert losses(single) and losses(single) == losses(double)  # equal to the 4 printed decimals
    final = re.compile(r"test accuracy (\d\.\d+)")
    assert final.search(single).group(1) == final.search(double).group(1)  # type: ignore[union-attr]
