"""CUDA tensors in a job started by torchrun (no MPI): unison's Horovod-style API, torch.distributed on the
"unison" backend and DDP on a CUDA module, the same checks as tests/torchrun on CPU tensors.

At one rank the tensors go through NCCL; at two ranks sharing one GPU they are staged through host memory
on the job's gloo transport.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu._needs import torch_with_cuda
from tests.torchrun.test_torchrun import check_api_results, torchrun

torch = torch_with_cuda()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [1, 2])
def test_the_api_and_the_backend_on_cuda_tensors_under_torchrun(tmp_path: Path, n: int) -> None:
    env = {"UNISON_GPU_OPERATIONS": "MPI"} if torch.cuda.device_count() < n else {}
    check_api_results(torchrun(n, tmp_path, "api", env=env, device="cuda"), tmp_path, n)
