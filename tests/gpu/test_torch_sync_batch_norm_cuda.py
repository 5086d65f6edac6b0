"""SyncBatchNorm on CUDA: statistics exchanged through the GPU data plane without host reads, equal to BatchNorm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu._needs import mpiexec, torch_with_cuda

torch = torch_with_cuda()

from unison.adapters.torch import sync_batch_norm as sbn  # noqa: E402

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def job() -> Any:
    import unison.torch as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_exchange_stays_on_the_gpu_and_never_synchronizes_the_host(job: Any, dtype: torch.dtype) -> None:
    """The synchronizing path itself at size 1: torch's sync debug mode raises on any host read."""
    torch.cuda.set_device(0)
    x = (torch.randn(16, 3, 8, 8, device="cuda") * 2 + 1).to(dtype).requires_grad_()
    weight = torch.linspace(0.5, 2, 3, device="cuda", dtype=dtype, requires_grad=True)
    bias = torch.linspace(-1, 1, 3, device="cuda", dtype=dtype, requires_grad=True)
    running_mean, running_var = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
    dy = torch.randn_like(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = sbn._SyncBatchNormFunction.apply(x, weight, bias, running_mean, running_var, 1e-5, 0.1, "sbn")
        y.backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    xr = x.detach().float().requires_grad_()
    wr, br = weight.detach().float().requires_grad_(), bias.detach().float().requires_grad_()
    rm, rv = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
    yr = torch.nn.functional.batch_norm(xr, rm, rv, wr, br, True, 0.1, 1e-5)
    yr.backward(dy.float())
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if dtype is torch.float16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(y.float(), yr, **tolerance)
    torch.testing.assert_close(x.grad.float(), xr.grad, **tolerance)
    torch.testing.assert_close(weight.grad.float(), wr.grad, **tolerance)
    torch.testing.assert_close(running_mean, rm, **tolerance)
    torch.testing.assert_close(running_var, rv, **tolerance)


@pytest.mark.timeout(360)  # the job's own bound (300 s) comes first
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_match_batch_norm_on_the_global_batch(ranks: int) -> None:
    launcher = mpiexec()
    env = dict(os.environ)
    if torch.cuda.device_count() < ranks:
        env["UNISON_GPU_OPERATIONS"] = "MPI"  # ranks share a GPU: staged (NCCL refuses that, by name)
    done = subprocess.run([launcher, "-n", str(ranks), sys.executable, "tests/gpu/sync_batch_norm_job.py"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.endswith(": OK")) == [
        f"rank {r}: OK" for r in range(ranks)]
