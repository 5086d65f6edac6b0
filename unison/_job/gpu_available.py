"""`gpu_available(framework)`: whether this machine can reduce that framework's GPU tensors.

Horovod's ``gpu_available(ext_base_name)`` imports the framework in a separate process and asks it
whether it sees a GPU, so that the caller's own process does not initialize CUDA (which breaks a
later ``fork``) or pay for an import it may not need. unison asks the same question the same way,
and also asks whether its GPU data plane can run there (a CUDA build of CuPy imports, as
``cuda_built()`` says): without it a framework's GPU tensors cannot be reduced, whatever the
framework sees.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ..errors import InvalidArgumentError

__all__ = ["gpu_available"]

# What the child runs: the framework's own "do you see a GPU", then unison's build probe.
_CHECKS = {
    "torch": "import torch\nsees = torch.cuda.is_available() and torch.cuda.device_count() > 0\n",
    "tensorflow": "import tensorflow as tf\nsees = bool(tf.config.list_physical_devices('GPU'))\n",
}
_REPORT = ("import json\nfrom unison.gpu.build import cuda_built\n"
           "print(json.dumps({'framework': bool(sees), 'plane': cuda_built()}))\n")
_WITHOUT_GPU_SUPPORT = ("mxnet",)  # Horovod frameworks unison has no adapter for
_TIMEOUT_SECONDS = 300.0


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Return True when `ext_base_name`'s GPU tensors can be reduced by unison on this machine.

    That is: the framework, imported in a child process, sees a GPU, and unison's GPU data plane
    can run (CuPy with CUDA, ``pip install -e '.[gpu]'``). False when either is missing, when the
    framework is not installed, and for ``"mxnet"`` (unison has no MXNet adapter).

    Args:
        ext_base_name: ``"torch"`` or ``"tensorflow"`` (Horovod's extension names; ``"mxnet"``).
        verbose: let the child's output (the framework's import messages, an import error) through
            to this process's stdout and stderr instead of discarding it.

    Raises:
        InvalidArgumentError: `ext_base_name` is not one of those names.

    Example:
        >>> import unison.tensorflow as hvd                 # doctest: +SKIP
        >>> hvd.gpu_available("tensorflow")                  # doctest: +SKIP
        False
    """
    if ext_base_name in _WITHOUT_GPU_SUPPORT:
        return False
    check = _CHECKS.get(ext_base_name)
    if check is None:
        names = ", ".join(repr(n) for n in (*_CHECKS, *_WITHOUT_GPU_SUPPORT))
        raise InvalidArgumentError(
            f"gpu_available() takes a framework name: one of {names}. Got {ext_base_name!r}."
        )
    output = None if verbose else subprocess.DEVNULL
    try:
        child = subprocess.run([sys.executable, "-c", check + _REPORT], stdout=subprocess.PIPE,
                               stderr=output, text=True, timeout=_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    lines = child.stdout.strip().splitlines()
    if verbose and lines[:-1]:  # what the framework printed, before the answer on the last line
        sys.stdout.write("\n".join(lines[:-1]) + "\n")
    if child.returncode != 0 or not lines:
        return False
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return False
    return bool(answer.get("framework")) and bool(answer.get("plane"))
