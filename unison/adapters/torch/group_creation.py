"""torch's group creation on the ``"unison"`` backend: a subset group's unison process set registered on every rank."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.distributed as dist

from ..._job import runtime as _runtime
from ..._job.objects import process_set_of
from ...errors import UnisonNotImplementedError

if TYPE_CHECKING:
    from typing import TypeVar

    _R = TypeVar("_R")  # what a wrapped function returns

__all__ = ["BACKEND_NAME", "registering_sets"]

BACKEND_NAME = "unison"


def registering_sets(original: Callable[..., _R]) -> Callable[..., _R]:
    """torch's group creation (behind ``new_group``, ``new_subgroups`` and DeviceMesh), registering the
    unison process set of a subset group's ranks on every rank first when the group is unison's.

    torch runs it on every rank for ``new_group`` (its contract), and calls the backend on the members
    only; unison registers a process set on every rank, in the same order. Calls made on the members
    alone (a tag of functional collectives, ``use_local_synchronization``) register nothing: their
    backend then says why it cannot run the group.
    """
    signature = inspect.signature(original)

    def create(*args: object, **kwargs: object) -> _R:
        call = signature.bind_partial(*args, **kwargs).arguments
        ranks, backend = call.get("ranks"), call.get("backend")
        if (ranks is not None and call.get("pg_tag") is None and _is_unison(backend)
                and sorted(ranks) != list(range(dist.get_world_size()))):
            if call.get("use_local_synchronization"):
                raise UnisonNotImplementedError(
                    f"dist.new_group(ranks={list(ranks)}, use_local_synchronization=True) on the unison backend: "
                    "unison registers a group's process set on every rank. Leave use_local_synchronization out "
                    "(every rank calls new_group), or use backend='gloo' for this group.")
            if call.get("sort_ranks", True) or list(ranks) == sorted(ranks):
                if not _runtime.is_initialized():
                    _runtime.init()
                process_set_of(sorted(int(r) for r in ranks))
        return original(*args, **kwargs)
    create.unison_sets = True  # type: ignore[attr-defined]
    return create


def _is_unison(backend: str | None) -> bool:
    """Whether a group made with `backend` (None: the default group's) runs on the unison backend."""
    if backend is None or backend == "":
        if not dist.is_initialized():
            return False
        backend = dist.get_backend()
    return BACKEND_NAME in str(backend).lower()
