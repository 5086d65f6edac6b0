"""GPU tests: skipped, with the reason, where CuPy or a visible GPU is missing (docs/gpu.md runs them)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest


def _why_not() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install -e '.[gpu-cuda12]' or '.[gpu-cuda13]')"
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - any CUDA failure means no usable GPU
        return f"no usable GPU: {type(exc).__name__}: {exc}"
    return "" if count else "no GPU is visible (CUDA_VISIBLE_DEVICES?)"


REASON = _why_not()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if REASON:
        for item in items:
            if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
                item.add_marker(pytest.mark.skip(reason=REASON))
