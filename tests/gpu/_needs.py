"""What the GPU tests that start processes or use torch need: each returns it, or skips with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from unison.testing.run import find_mpiexec


def torch_with_cuda() -> Any:
    """torch, where it sees a GPU; else the calling module (or test) is skipped."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU (a CPU-only build, or CUDA_VISIBLE_DEVICES hides it)",
                    allow_module_level=True)
    return torch


def mpiexec() -> str:
    """The mpiexec multi-rank GPU tests start ranks with (`find_mpiexec`); else the caller is skipped."""
    found = find_mpiexec()
    if found is None:
        pytest.skip("mpiexec not found (pip install -e '.[mpi]', or put an MPI's bin on PATH)",
                    allow_module_level=True)
    return found
