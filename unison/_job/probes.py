"""Build probes: what this installation can use, answered before `init()` without starting anything."""

from __future__ import annotations

import importlib.util

__all__ = ["ccl_built", "cuda_built", "ddl_built", "gloo_built", "mpi_built", "nccl_built", "rocm_built"]


def mpi_built() -> bool:
    """Whether mpi4py is installed (callable before init; does not initialize MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def gloo_built() -> bool:
    """Whether the gloo transport can be used: torch is installed (callable before init; imports nothing)."""
    return importlib.util.find_spec("torch") is not None


def nccl_built() -> int:
    """NCCL's version code as CuPy loads it (e.g. 22005 for 2.20.5), or 0 without CuPy or NCCL."""
    from ..gpu.build import nccl_built as probe

    return probe()


def ddl_built() -> bool:
    """Always False."""
    return False


def ccl_built() -> bool:
    """Always False."""
    return False


def cuda_built() -> bool:
    """True when a CUDA build of CuPy imports (the GPU data plane can run where a GPU is visible)."""
    from ..gpu.build import cuda_built as probe

    return probe()


def rocm_built() -> bool:
    """Always False."""
    return False
