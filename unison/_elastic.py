"""The `hvd.elastic` attribute of the framework modules, and the error of the elastic modules not written yet."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .errors import MissingDependencyError

__all__ = ["elastic_getattr", "unavailable"]


def unavailable(module: str) -> MissingDependencyError:
    """The error an elastic module raises at import: what is missing, and what to use meanwhile.

    Example:
        >>> print(unavailable("unison.keras.elastic"))   # doctest: +ELLIPSIS
        Elastic training (unison.keras.elastic: ...) is not available in unison yet; only unison.torch.elastic is. ...
    """
    return MissingDependencyError(
        f"Elastic training ({module}: elastic.run, its State classes and Keras callbacks for "
        "TensorFlow and Keras) is not available in unison yet; only unison.torch.elastic is. Meanwhile "
        "run a fixed number of processes with `unisonrun -np N` (or unison.run(fn, num_proc=N)), save "
        "checkpoints on rank 0, and restart the job from the last one if a rank fails; see "
        "docs/migrating-from-horovod.md."
    )


def elastic_getattr(package: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that makes ``hvd.elastic`` import ``<package>.elastic``.

    Horovod's framework modules import their elastic submodule, so scripts reach it as an attribute;
    an elastic module not written yet raises `unavailable`'s error instead of an AttributeError.
    """

    def __getattr__(name: str) -> Any:
        if name == "elastic":
            return importlib.import_module(f"{package}.elastic")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
