"""The PyTorch examples' --device flag: cpu trains as before; cuda without a GPU exits with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
SCRIPTS = ["examples/pytorch_mnist.py", "examples/pytorch_synthetic_benchmark.py"]


def run(*args: str, ranks: int = 2, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    command = [str(MPIEXEC), "-n", str(ranks), sys.executable, *args] if ranks > 1 else [sys.executable, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_mnist_on_the_cpu_device_trains(tmp_path: Path) -> None:
    done = run("examples/pytorch_mnist.py", "--device", "cpu", "--epochs", "2", "--checkpoint",
               str(tmp_path / "model.pt"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracies = [float(a) for a in re.findall(r"test loss [\d.]+ acc (\d\.\d+)", done.stdout)]
    assert len(accuracies) == 2 and accuracies[-1] > 0.7, done.stdout


def test_synthetic_benchmark_on_the_cpu_device_reports_throughput() -> None:
    done = run("examples/pytorch_synthetic_benchmark.py", "--device", "cpu", "--num-warmup-batches", "1",
               "--num-batches-per-iter", "1", "--num-iters", "1", "--batch-size", "4", "--image-size", "16")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"Img/sec per rank: [\d.]+", done.stdout), done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: tests/gpu runs --device cuda instead")
@pytest.mark.parametrize("script", SCRIPTS)
def test_cuda_without_a_gpu_exits_with_the_reason(script: str) -> None:
    done = run(script, "--device", "cuda", ranks=1, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"--device cuda needs a GPU that PyTorch can use, and torch\.cuda\.is_available\(\) is False "
                     r"on \S+ \(torch .+, (built for CUDA .+|a CPU-only build)\)\. Install a CUDA build of PyTorch, check "
                     r"CUDA_VISIBLE_DEVICES, or run with --device cpu\.", done.stderr), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_device_is_refused_by_the_parser(script: str) -> None:
    done = run(script, "--device", "tpu", ranks=1, timeout=120)
    assert done.returncode == 2
    assert "argument --device: invalid choice: 'tpu' (choose from" in done.stderr, done.stderr[-2000:]
