"""The PyTorch examples with --device cuda: they train on the local rank's GPU; too many ranks per host are named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu._needs import mpiexec, torch_with_cuda

torch = torch_with_cuda()
ROOT = Path(__file__).parents[2]
MPIEXEC = mpiexec()


def run(ranks: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.timeout(360)  # the run's own bound (300 s) comes first
def test_mnist_trains_on_the_gpu(tmp_path: Path) -> None:
    ranks = min(2, torch.cuda.device_count())
    done = run(ranks, "examples/pytorch_mnist.py", "--device", "cuda", "--epochs", "3",
               "--checkpoint", str(tmp_path / "model.pt"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracy = float(re.findall(r"test loss [\d.]+ acc (\d\.\d+)", done.stdout)[-1])
    assert accuracy > 0.85, done.stdout
    state = torch.load(tmp_path / "model.pt", map_location="cpu")
    assert state["epoch"] == 3


@pytest.mark.timeout(360)
def test_the_ddp_example_on_the_unison_backend_trains_on_the_gpu() -> None:
    done = run(min(2, torch.cuda.device_count()), "examples/pytorch_ddp_digits.py", "--device", "cuda",
               "--epochs", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracy = float(re.findall(r"test acc (\d\.\d+)", done.stdout)[-1])
    assert accuracy > 0.85, done.stdout


@pytest.mark.timeout(360)
def test_synthetic_benchmark_on_the_gpu() -> None:
    done = run(min(2, torch.cuda.device_count()), "examples/pytorch_synthetic_benchmark.py", "--device", "cuda",
               "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"Img/sec per rank: [\d.]+", done.stdout), done.stdout


@pytest.mark.timeout(240)
def test_more_ranks_than_gpus_names_the_local_rank() -> None:
    gpus = torch.cuda.device_count()
    done = run(gpus + 1, "examples/pytorch_synthetic_benchmark.py", "--device", "cuda", "--num-iters", "1",
               timeout=180)
    assert done.returncode != 0
    assert re.search(rf"local rank {gpus} \(rank {gpus}\) has none: {gpus} GPU\(s\) are visible on \S+\. "
                     rf"Start at most {gpus} rank\(s\) per host\.", done.stderr), done.stderr[-3000:]
