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


def test_every_example_import_comes_from_an_extra_that_is_not_dev() -> None:
    # A user installs the extras the README names (mpi, torch, tensorflow, grpc, examples, ray), not the
    # development tools: every module an example imports must come from one of those.
    import ast
    import re

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = project["dependencies"] + [r for name in ("mpi", "torch", "tensorflow", "grpc", "examples", "ray")
                                              for r in extras.get(name, [])]
    distributions = {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}
    # import name -> the distributions that provide it
    provided_by = {"numpy": {"numpy"}, "torch": {"torch"}, "tensorflow": {"tensorflow", "tensorflow-cpu"},
                   "keras": {"keras"}, "sklearn": {"scikit-learn"}, "mpi4py": {"mpi4py"},
                   "grpc": {"grpcio"}, "ray": {"ray"}}
    local = {path.stem for path in (ROOT / "examples").glob("*.py")} | {"unison"}
    missing = []
    for script in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top == "__future__":
                    continue
                if not provided_by.get(top, set()) & distributions:
                    missing.append(f"{script.name}: {top}")
    assert missing == [], "examples import modules no user-facing extra installs"
