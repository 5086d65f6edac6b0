"""The launch of one process alone: no MPI, no store, the in-memory transport."""

from __future__ import annotations

from ...backends import create_backend
from ...backends.base import Backend
from ...config import Settings
from .base import Launch, Place

__all__ = ["SingleProcess"]


class SingleProcess(Launch):
    """A job of this process alone (no launcher started it, and mpi4py is not installed or not wanted)."""

    name = "single"

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    def join(self, settings: Settings) -> None:
        """Nothing to reach."""

    def check_start(self, problem: BaseException | None, settings: Settings) -> None:
        if problem is not None:
            raise problem

    def place(self) -> Place:
        return Place(0, 1)

    def exchange(self, payload: bytes) -> list[bytes]:
        return [payload]

    def connect(self, settings: Settings, place: Place) -> Backend:
        return create_backend("loopback", None, settings)
