"""Keras 2 (tf_keras) through unison, in processes started with ``TF_USE_LEGACY_KERAS=1``.

``tf.keras`` becomes Keras 2 only when that variable is set before TensorFlow is first imported, so
each case here starts its own processes: the Keras 2 multi-rank cases as a 2-rank job, the
Horovod-signature and public-API checks, and which Keras each unison module serves.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]

pytestmark = [pytest.mark.long_jobs, pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None or importlib.util.find_spec("tensorflow") is None,
    reason="needs tensorflow and tf-keras (the Makefile installs the tf-keras of the installed TensorFlow's minor version)")]


def _environment(**extra: str) -> dict[str, str]:
    # Variables of an enclosing MPI job or unison run must not leak into the jobs started here.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "HOROVOD_", "PMI_", "OMPI_"))}
    env.update({"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **extra})
    return env


def _run(args: list[str], timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_environment(**extra))


@pytest.mark.timeout(960)
def test_keras2_multirank_cases_pass_on_two_ranks() -> None:
    """fit on 2 ranks equals one process on the global batch, the callbacks, load_model, elastic
    states and callbacks, and Horovod's resume recipe (tests/multirank/test_keras2.py and
    test_keras_resume.py)."""
    done = _run([sys.executable, "-m", "unison.testing.run", "-n", "2", "--job-timeout", "840",
                 "tests/multirank/test_keras2.py", "tests/multirank/test_keras_resume.py"], timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    summary = re.findall(r"=+ (.*) in [\d.]+s", out)
    assert summary and "passed" in summary[-1] and "skipped" not in summary[-1], out[-3000:]


@pytest.mark.timeout(300)
def test_signatures_and_public_modules_hold_under_keras2() -> None:
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "tests/unit/test_horovod_signatures.py", "tests/unit/adapters/test_tf_public_api.py",
                 # what Keras does not touch (each imports another framework: 10 s)
                 "--deselect", "tests/unit/adapters/test_tf_public_api.py::test_unison_tensorflow_does_not_import_torch",
                 "--deselect", "tests/unit/test_horovod_signatures.py::test_gpu_available_answers_for_each_framework"],
                timeout=280)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


_WHICH = """
import keras, tf_keras
import unison.keras as hk, unison.tensorflow.keras as hvd
for name, module in (("unison.keras", hk), ("unison.tensorflow.keras", hvd)):
    base = module.callbacks.BroadcastGlobalVariablesCallback.__mro__
    print(name, "keras2" if tf_keras.callbacks.Callback in base else
          "keras3" if keras.callbacks.Callback in base else "?")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "expected"), [
    ("tensorflow", ["unison.keras keras2", "unison.tensorflow.keras keras2"]),
    # Keras 3 on torch has no tf.keras to follow: unison.keras serves Keras 3 there.
    ("torch", ["unison.keras keras3", "unison.tensorflow.keras keras2"]),
])
def test_each_module_serves_the_keras_tf_keras_is(backend: str, expected: list[str]) -> None:
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    done = _run([sys.executable, "-c", _WHICH], timeout=110, KERAS_BACKEND=backend)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == expected
