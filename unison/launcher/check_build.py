"""`unisonrun --check-build`: versions, usable backends and frameworks, then a 2-process self-test."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

from ..errors import LaunchError

__all__ = ["check_build"]

_SELF_TEST = """\
import numpy as np
import unison
from mpi4py import MPI
unison.init()
r, n = unison.rank(), unison.size()
total = unison.allreduce(np.full(4, r + 1.0), op=unison.Sum, name="selftest.allreduce")
assert np.allclose(total, n * (n + 1) / 2), total
root = unison.broadcast(np.arange(3.0) * (r == 0), root_rank=0, name="selftest.broadcast")
assert np.allclose(root, np.arange(3.0)), root
levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
          MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
if r == 0:
    print("selftest-thread-level", levels.get(MPI.Query_thread(), "?"), flush=True)
unison.shutdown()
"""

_IMPORT_TIMEOUT_SECONDS = 120


def _version(module: str) -> str:
    """Version of the installed distribution providing `module` (tensorflow may come as tensorflow-cpu)."""
    names = importlib.metadata.packages_distributions().get(module, []) or [module]
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _imports(module: str) -> str:
    """'ok' if `module` imports in a fresh interpreter, else the last line of the error."""
    try:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=_IMPORT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return f"import took over {_IMPORT_TIMEOUT_SECONDS} s"
    if done.returncode == 0:
        return "ok"
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def check_build(mpiexec: str = "") -> int:
    """Print the build report and run the self-test; return 0 on PASS."""
    from .._version import __version__
    from .mpi.mpiexec import find_mpiexec, loaded_library

    rows = [("unison", __version__), ("Python", f"{platform.python_version()} ({sys.executable})"),
            ("numpy", _version("numpy")), ("mpi4py", _version("mpi4py"))]
    for dist in ("torch", "tensorflow", "keras"):
        rows.append((dist, _version(dist)))
    try:
        library = loaded_library()
    except LaunchError as exc:
        library = f"unusable: {exc}"
    rows.append(("MPI library", library))
    print("unison build check")
    for name, value in rows:
        print(f"  {name:<14} {value}")
    print("backends and frameworks:")
    print(f"  {'mpi':<14} {'ok' if not library.startswith('unusable') else 'unusable'}")
    for module in ("torch", "tensorflow", "keras"):
        status = _imports(module) if _version(module) != "not installed" else "not installed"
        print(f"  {module:<14} {status}")
    print("GPU data plane:")
    from ..gpu.build import gpu_report

    for name, value in gpu_report():
        print(f"  {name:<14} {value}")
    try:
        found = find_mpiexec(mpiexec)
    except LaunchError as exc:
        print(f"  {'mpiexec':<14} {exc}")
        print("self-test: FAILED (no usable mpiexec)")
        return 1
    print(f"  {'mpiexec':<14} {found.path} ({found.vendor} {found.version})")
    print("self-test (2 processes: init, allreduce, broadcast, shutdown) ...", flush=True)
    command = found.command(2, [sys.executable, "-c", _SELF_TEST])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              cwd=str(Path(sys.executable).parent))
    except subprocess.TimeoutExpired:
        print("self-test: FAILED (no answer within 120 s)")
        return 1
    for line in done.stdout.splitlines():
        if line.startswith("selftest-thread-level"):
            print(f"  {'thread level':<14} {line.split()[-1]}")
    if done.returncode == 0:
        print("self-test: PASS")
        return 0
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    print(f"self-test: FAILED (exit status {done.returncode}):\n{tail}")
    return 1
