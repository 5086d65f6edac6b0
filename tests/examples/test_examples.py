"""Every example runs on 2 ranks and does what it says (short runs)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.long_jobs

ROOT = Path(__file__).parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def run2(*args: str, timeout: float = 240) -> str:
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def accuracy(output: str, pattern: str) -> float:
    found = re.findall(pattern, output)
    assert found, output[-2000:]
    return float(found[-1])


def test_pytorch_mnist_trains_and_checkpoints_atomically(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.pt"
    out = run2("examples/pytorch_mnist.py", "--epochs", "3", "--checkpoint", str(checkpoint))
    assert accuracy(out, r"test loss [\d.]+ acc (\d\.\d+)") > 0.85
    assert checkpoint.exists() and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("scheme", ["powersgd", "fp16"])
def test_pytorch_mnist_with_compression(scheme: str, tmp_path: Path) -> None:
    out = run2("examples/pytorch_mnist.py", "--epochs", "3", "--compression", scheme,
               "--checkpoint", str(tmp_path / "model.pt"))
    assert accuracy(out, r"test loss [\d.]+ acc (\d\.\d+)") > 0.85
    sent = float(re.search(rf"{scheme}: sent ([\d.]+)% of the gradient bytes", out).group(1))
    if scheme == "fp16":
        assert sent == 50.0, out
    else:
        assert 0 < sent < 50, out


def test_keras_mnist_fit_with_callbacks() -> None:
    assert accuracy(run2("examples/keras_mnist.py"), r"accuracy on all 1797 digits: (\d\.\d+)") > 0.9


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="needs tf-keras (the Makefile installs it)")
def test_tensorflow2_keras2_mnist_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """Keras 2 code as it is (tf.keras as tf_keras): fit with the callbacks, then Horovod's resume recipe."""
    first = run2("examples/tensorflow2_keras2_mnist.py", "--epochs", "2", "--checkpoint-dir", str(tmp_path))
    assert "tf.keras is tf_keras; the optimizer is tf_keras.src.optimizers.legacy.adam.Adam" in first, first
    assert "resumed from epoch 0" in first and "finished gradual learning rate warmup" in first, first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1.h5", "checkpoint-2.h5"]
    second = run2("examples/tensorflow2_keras2_mnist.py", "--epochs", "3", "--checkpoint-dir", str(tmp_path))
    assert "resumed from epoch 2" in second and "Epoch 3/3" in second and "Epoch 1/3" not in second, second
    assert accuracy(second, r"accuracy on all 1797 digits: (\d\.\d+)") > 0.85


def test_tensorflow2_mnist_gradient_tape() -> None:
    assert accuracy(run2("examples/tensorflow2_mnist.py"), r"accuracy on all 1797 digits: (\d\.\d+)") > 0.9


@pytest.mark.parametrize("script", ["examples/pytorch_synthetic_benchmark.py",
                                    "examples/tensorflow2_synthetic_benchmark.py"])
def test_synthetic_benchmarks_report_throughput(script: str) -> None:
    out = run2(script, "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
               "--batch-size", "8")
    assert re.search(r"Img/sec per rank: [\d.]+", out), out


def test_pytorch_adasum_digits_compares_average_and_adasum() -> None:
    out = run2("examples/pytorch_adasum_digits.py", "--lrs", "0.1,1.0")
    table = {(op, float(lr)): float(loss)
             for op, lr, loss in re.findall(r"^(Average|Adasum)\s+([\d.]+)\s+([\d.]+)", out, re.MULTILINE)}
    assert len(table) == 4, out
    # at a small learning rate Adasum moves further per step; at a large one it is first to overshoot
    assert table[("Adasum", 0.1)] < 0.8 * table[("Average", 0.1)], table
    assert table[("Average", 1.0)] < table[("Adasum", 1.0)], table


@pytest.mark.timeout(60)
def test_ps_ctr_trains_on_parameter_servers() -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "OMPI_"))}
    done = subprocess.run([str(Path(sys.executable).parent / "unisonrun"), "-np", "2", "--pservers", "1",
                           sys.executable, "examples/ps_ctr.py", "--steps", "30"],
                          capture_output=True, text=True, timeout=50, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Asynchronous: a trainer that starts late measures its "initial" loss on a table the other has
    # already trained, so the baseline is the highest initial loss, the one nearest the untrained model.
    before = max(accuracy(done.stdout, rf"trainer {t} initial held-out log loss (\d\.\d+)") for t in (0, 1))
    for trainer in (0, 1):
        after = accuracy(done.stdout, rf"trainer {trainer} final held-out log loss (\d\.\d+)")
        assert after < before - 0.1, done.stdout


def test_pytorch_ddp_on_the_unison_backend_trains() -> None:
    out = run2("examples/pytorch_ddp_digits.py", "--epochs", "6")
    assert accuracy(out, r"test acc (\d\.\d+)") > 0.9


def test_pytorch_ddp_example_names_a_rank_out_of_step() -> None:
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "examples/pytorch_ddp_digits.py", "--epochs", "4",
                           "--desync"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode != 0
    errors = done.stdout + done.stderr
    assert re.search(r"MismatchError: Mismatched ALLREDUCE tensor shapes for 'allreduce\.torch\.pg\.[\w.]+': "
                     r"\[2\] on rank \[0\]; \[3\] on rank \[1\]", errors), errors[-3000:]
