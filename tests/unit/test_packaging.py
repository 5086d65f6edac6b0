"""The wheel carries what an installed unison needs beyond its modules: the typing marker and stubs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(300)
def test_the_wheel_is_typed_and_carries_the_service_stubs(tmp_path: Path) -> None:
    # Without py.typed a user's type checker ignores unison's annotations (PEP 561), so it would not
    # know, for example, that DistributedOptimizer's result has synchronize() and statistics().
    # Built from a copy: a build/ folder left in the work tree would be reused and could hide a change.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "unison", source / "unison", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(tmp_path), str(source)], check=True, capture_output=True, timeout=280)
    (wheel,) = tmp_path.glob("unison-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"unison/py.typed", "unison/service/coordinator_pb2.pyi", "unison/service/coordinator.proto",
            "unison/service/coordinator_pb2.py", "unison/torch/__init__.py"} <= names
