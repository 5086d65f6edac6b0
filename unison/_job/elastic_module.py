"""The `hvd.elastic` attribute of the framework modules: it imports their elastic submodule on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["elastic_getattr"]


def elastic_getattr(package: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that makes ``hvd.elastic`` import ``<package>.elastic``.

    Horovod's framework modules import their elastic submodule, so scripts reach it as an attribute;
    unison imports it only when it is used, so that ``import unison.torch`` stays light.
    """

    def __getattr__(name: str) -> Any:
        if name == "elastic":
            return importlib.import_module(f"{package}.elastic")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
