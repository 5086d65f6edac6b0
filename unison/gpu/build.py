"""What this installation can do on GPUs: NCCL's version, CUDA support, CUDA-aware MPI, the build report rows.

Every function takes the module lookup as an argument (default: the real import machinery), so the
answers are unit-tested with fake modules on machines without CUDA. None of them raises: a broken
CUDA installation reads as "not built" plus the reason in the report. CuPy is imported only when it
is installed, and only when a function is called.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["cuda_aware_mpi", "cuda_built", "gpu_report", "nccl_built", "nccl_version_text"]

Finder = Callable[[str], object]  # a module name -> its spec, or None when it is not installed
Importer = Callable[[str], ModuleType]


def _cupy(find_spec: Finder, import_module: Importer) -> ModuleType | None:
    if find_spec("cupy") is None:
        return None
    try:
        return import_module("cupy")
    except Exception:  # noqa: BLE001 - a CuPy that cannot load means no GPU support
        return None


def nccl_built(find_spec: Finder = importlib.util.find_spec, import_module: Importer = importlib.import_module) -> int:
    """NCCL's version code as CuPy loads it (e.g. 22005 for 2.20.5), or 0 without CuPy or NCCL.

    Example:
        >>> nccl_built(find_spec=lambda name: None)
        0
    """
    if _cupy(find_spec, import_module) is None:
        return 0
    try:
        nccl = import_module("cupy.cuda.nccl")
        if not getattr(nccl, "available", True):
            return 0
        return int(nccl.get_version())
    except Exception:  # noqa: BLE001 - the library is missing or cannot load
        return 0


def cuda_built(find_spec: Finder = importlib.util.find_spec, import_module: Importer = importlib.import_module) -> bool:
    """True when a CUDA build of CuPy imports (the GPU data plane can run where a GPU is visible)."""
    return _cupy(find_spec, import_module) is not None


def nccl_version_text(code: int) -> str:
    """NCCL's version code as text (codes before 2.9 used another layout).

    Example:
        >>> nccl_version_text(22005), nccl_version_text(2804), nccl_version_text(0)
        ('2.20.5', '2.8.4', 'not available')
    """
    if code <= 0:
        return "not available"
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def cuda_aware_mpi(mpi: ModuleType, load_library: Callable[[str], object] | None = None) -> bool | None:
    """Whether the loaded MPI library says it is CUDA-aware; None when it cannot tell.

    Never assumed: only MPI's own answer counts, ``MPI.Query_cuda_support`` where mpi4py has it, else
    the library's ``MPIX_Query_cuda_support`` (Open MPI, MPICH 4) looked up through the mpi4py
    extension that links it (`load_library`: ``ctypes.CDLL`` by default). Call it after MPI_Init.

    Example:
        >>> import types
        >>> cuda_aware_mpi(types.SimpleNamespace(Query_cuda_support=lambda: 1))
        True
    """
    query = getattr(mpi, "Query_cuda_support", None)
    if query is None:
        import ctypes

        path = getattr(mpi, "__file__", None)
        if not path:
            return None
        try:
            query = getattr((load_library or ctypes.CDLL)(path), "MPIX_Query_cuda_support", None)
        except Exception:  # noqa: BLE001 - no such library or symbol: cannot tell
            return None
        if query is None:
            return None
        if hasattr(query, "restype"):  # a C function: it takes nothing and returns an int
            query.restype, query.argtypes = ctypes.c_int, []
    try:
        return bool(query())
    except Exception:  # noqa: BLE001 - the library has no such query after all
        return None


def ask_mpi_in_a_child(timeout_seconds: float = 60.0) -> bool | None | str:
    """`cuda_aware_mpi` asked in a child process, so that this one never starts MPI (importing
    mpi4py.MPI calls MPI_Init, which a launcher must not do); a string says why there is no answer."""
    if importlib.util.find_spec("mpi4py") is None:
        return "no MPI (mpi4py not installed)"
    code = "from mpi4py import MPI; from unison.gpu.build import cuda_aware_mpi; print(cuda_aware_mpi(MPI))"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_seconds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not asked ({type(exc).__name__})"
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if answer == ["True"]:
        return True
    if answer == ["False"]:
        return False
    if answer == ["None"]:
        return None
    return f"not asked (MPI could not start: exit {done.returncode})"


def _cuda_aware_text(answer: bool | None | str) -> str:
    if isinstance(answer, str):
        return answer
    if answer is None:
        return "cannot tell (the MPI library has no MPIX_Query_cuda_support): UNISON_GPU_OPERATIONS=MPI stages"
    return "yes (UNISON_GPU_OPERATIONS=MPI hands it device buffers)" if answer else "no (UNISON_GPU_OPERATIONS=MPI stages)"


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def gpu_report(find_spec: Finder = importlib.util.find_spec, import_module: Importer = importlib.import_module,
               ask_mpi: Callable[[], bool | None | str] | None = None) -> list[tuple[str, str]]:
    """(name, value) rows for ``unisonrun --check-build``: CuPy, CUDA runtime and driver, NCCL, GPUs.

    Example:
        >>> gpu_report(find_spec=lambda name: None)
        [('CuPy', 'not installed (pip install cupy-cuda12x or cupy-cuda13x: the gpu-cuda12 / gpu-cuda13 extras)')]
    """
    cupy = _cupy(find_spec, import_module)
    if cupy is None:
        state = "not installed" if find_spec("cupy") is None else "installed but does not import"
        return [("CuPy", f"{state} (pip install cupy-cuda12x or cupy-cuda13x: the gpu-cuda12 / gpu-cuda13 extras)")]
    rows = [("CuPy", str(getattr(cupy, "__version__", "?")))]
    try:
        runtime = cupy.cuda.runtime
        rows.append(("CUDA runtime", _cuda_version(int(runtime.runtimeGetVersion()))))
        driver = int(runtime.driverGetVersion())  # 0: no NVIDIA driver on this machine
        rows.append(("CUDA driver", _cuda_version(driver) if driver else "none (no NVIDIA driver found)"))
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        rows.append(("CUDA", f"unusable: {exc}"))
    rows.append(("NCCL", nccl_version_text(nccl_built(find_spec, import_module))))
    rows.append(("CUDA-aware MPI", _cuda_aware_text((ask_mpi or ask_mpi_in_a_child)())))
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        names = []
        for ordinal in range(count):
            name = cupy.cuda.runtime.getDeviceProperties(ordinal)["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            names.append(f"cuda:{ordinal} {name} ({cupy.cuda.Device(ordinal).pci_bus_id})")
        rows.append(("GPUs", "; ".join(names) if names else "none visible"))
    except Exception as exc:  # noqa: BLE001 - no driver or no device: reported, not raised
        rows.append(("GPUs", f"none visible ({exc})"))
    return rows
