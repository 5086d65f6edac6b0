"""torch.distributed's "unison" backend on CUDA tensors: the multi-rank suite's torch.distributed cases
(every collective, DDP and its options, ZeroRedundancyOptimizer, FSDP2, a 1-D DeviceMesh, a mismatch named
at once, a CPU tensor beside a CUDA one) with the local GPU as torch's default device.

At one rank the CUDA tensors go through NCCL; at two ranks sharing one GPU they are staged through host
memory (NCCL refuses two ranks on one device), as docs/gpu.md says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu._needs import mpiexec, torch_with_cuda

torch = torch_with_cuda()
ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(330)  # the job's own bound (300 s) comes first
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_torch_distributed_suite_on_cuda_tensors(ranks: int) -> None:
    mpiexec()  # skips where there is none; tests/run_multirank.py finds the same one
    env = dict(os.environ, UNISON_TEST_TORCH_DEVICE="cuda")
    if torch.cuda.device_count() < ranks:
        env["UNISON_GPU_OPERATIONS"] = "MPI"
    done = subprocess.run(
        [sys.executable, "tests/run_multirank.py", "-n", str(ranks), "--job-timeout", "280",
         "tests/multirank/test_torch_distributed.py"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
