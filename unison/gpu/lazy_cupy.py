"""CuPy, imported on demand, and the error that names the pip extra when it is missing.

The one module of the GPU package that imports CuPy by name; `handoff` (the arrays' way in) and
`cupy_device` (the device and NCCL) both load it through here, so neither imports the other for it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from ..errors import MissingDependencyError

__all__ = ["EXTRAS", "import_cupy", "missing_cupy"]

# pip extras that install a CuPy build with NCCL, by CUDA major version (pyproject.toml).
EXTRAS = {"12": "gpu-cuda12", "13": "gpu-cuda13"}

_cupy: ModuleType | None = None  # CuPy, once an import of it finished


def missing_cupy(what: str, cause: BaseException | None = None) -> MissingDependencyError:
    """The error for a CUDA buffer when CuPy cannot be imported; it names the extras.

    Example:
        >>> str(missing_cupy("CUDA tensors")).split(";")[0]
        'CUDA tensors need CuPy (with NCCL), which is not installed'
    """
    detail = f" ({type(cause).__name__}: {cause})" if cause is not None and not isinstance(
        cause, ModuleNotFoundError) else ""
    return MissingDependencyError(
        f"{what} need CuPy (with NCCL), which is not installed{detail}; install the build for your CUDA "
        f"version: pip install cupy-cuda12x (CUDA 12; the {EXTRAS['12']} extra, pip install -e "
        f"'.[{EXTRAS['12']}]' in a unison checkout) or cupy-cuda13x (CUDA 13; the {EXTRAS['13']} extra). "
        "Or move the tensors to the CPU."
    )


def import_cupy(what: str = "CUDA tensors") -> ModuleType:
    """Import CuPy, or raise `missing_cupy(what)` (after the first import returned, no import machinery).

    The module is kept only once `import_module` returned it: ``sys.modules`` has it from the start
    of its import, and a second thread must wait for the first to finish (the import machinery does).
    """
    global _cupy
    if _cupy is not None and sys.modules.get("cupy") is _cupy:
        return _cupy
    try:
        _cupy = importlib.import_module("cupy")
    except ImportError as exc:
        raise missing_cupy(what, exc) from exc
    return _cupy
