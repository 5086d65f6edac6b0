"""examples/ray_digits.py with Horovod's RayExecutor: it trains to a useful accuracy on a local cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]


def test_the_executor_example_trains() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_digits.py"), "--workers", "2", "--epochs", "3"],
                          capture_output=True, text=True, timeout=170, cwd=ROOT, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"final test accuracy: (\d\.\d+)", done.stdout)
    assert found and float(found.group(1)) > 0.85, done.stdout[-2000:]
