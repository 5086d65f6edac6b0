"""The TensorFlow/Keras public modules: sorted, complete __all__; no torch imported by unison.tensorflow."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")


@pytest.mark.parametrize("module", ["unison.tensorflow", "unison.tensorflow.keras", "unison.keras",
                                    "unison.keras.callbacks"])
def test_all_is_sorted_and_complete(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == sorted(mod.__all__)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


def test_unison_tensorflow_does_not_import_torch() -> None:
    code = "import sys, unison.tensorflow; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "False"


def test_mpi_ops_and_util_are_attributes_of_unison_tensorflow_without_their_own_import() -> None:
    # Horovod's scripts and tests read hvd.mpi_ops._basics and hvd.util._executing_eagerly() after
    # `import horovod.tensorflow as hvd` alone; hvd._executing_eagerly is its module attribute too.
    code = ("import unison.tensorflow as hvd, tensorflow as tf\n"
            "print(hvd.mpi_ops.__name__, type(hvd.mpi_ops._basics).__name__)\n"
            "print(hvd.util._executing_eagerly(), hvd._executing_eagerly is hvd.util._executing_eagerly)\n"
            "with tf.Graph().as_default():\n"
            "    print(hvd.util._executing_eagerly())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["unison.tensorflow.mpi_ops", "Basics", "True", "True", "False"]
