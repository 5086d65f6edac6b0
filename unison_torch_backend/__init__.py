"""torch's plug-in hook for the ``"unison"`` backend: ``import torch`` calls `register` (entry point group
``torch.backends``), so that ``init_process_group("unison")`` works without ``import unison.torch``.

It stays outside the ``unison`` package, whose import (about 0.2 s) would otherwise come with every
``import torch``: it only names the backend, with a factory that imports ``unison.torch`` at the first
group, and lets env:// find the job's ranks through unison where an MPI launcher started the process
without ``MASTER_ADDR`` (there torch would stop with "environment variable RANK expected").
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns torch's plug-in loading off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["register"]

_MPI_LAUNCHERS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def register() -> None:
    """Name the ``"unison"`` backend with torch.distributed (nothing of unison is imported yet)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or hasattr(dist.Backend, "UNISON"):
        return
    dist.Backend.register_backend("unison", _create, extended_api=True, devices=["cpu", "cuda"])
    # the module, not the function torch.distributed exports under the same name
    handlers = getattr(sys.modules.get("torch.distributed.rendezvous"), "_rendezvous_handlers", None)
    if isinstance(handlers, dict) and "env" in handlers:
        handlers["env"] = _env_through_unison(handlers["env"])


def _create(options: Any, backend_options: object = None) -> Any:
    """The first group's factory: unison's own, once ``unison.torch`` is imported."""
    from unison.adapters.torch.process_group import create_process_group
    from unison.adapters.torch.process_group import register as register_unison

    register_unison()
    return create_process_group(options, backend_options)


def _env_through_unison(original: Any) -> Any:
    """torch's env:// rendezvous; where an MPI launcher started the process and ``MASTER_ADDR`` is unset,
    unison's (``import unison.torch`` puts it in front of torch's, and it meets the job's ranks)."""

    def handler(url: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if os.environ.get("MASTER_ADDR") or not any(
                os.environ.get(name, "1").strip() not in ("", "1") for name in _MPI_LAUNCHERS):
            yield from original(url, *args, **kwargs)
            return
        import unison.torch  # noqa: F401 - puts unison's env:// rendezvous in front of this one

        yield from sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers["env"](url, *args, **kwargs)

    handler.unison_plugin = True  # type: ignore[attr-defined]
    return handler
