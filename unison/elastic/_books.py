"""A State's own bookkeeping, kept apart from the values the user puts in it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .store import StateStore

__all__ = ["BOOKS", "Books"]

# Where a State keeps its own bookkeeping in its __dict__: not an identifier, so no state value can
# name it (values are attributes, and their names must be identifiers).
BOOKS = "unison elastic bookkeeping"


@dataclasses.dataclass
class Books:
    """A State's own bookkeeping, kept apart from the values the user puts in it (``epoch``, ``commits``, ...).

    Horovod's State keeps its values as attributes, so any name a user chooses is an attribute; a
    script that keeps a counter named ``commits`` (Horovod's own elastic scripts do) must not touch
    unison's commit number, nor a value named ``_saved`` the last save.
    """

    bcast_object: Callable[..., object]  # kept for Horovod's interface; the launch's broadcast replaces it
    get_rank: Callable[[], int]
    names: list[str] = dataclasses.field(default_factory=list)  # the user's values, in order
    reset_callbacks: list[Callable[[], object]] = dataclasses.field(default_factory=list)
    commits: int = 0  # commits since the job began (carried across launches)
    known_updates: int = 0
    driver_updates: int = 0
    asked_at: float = float("-inf")
    pending_check: tuple[int, np.ndarray] | None = None  # the broadcast the next check reads
    checked: int | None = None  # its value, when another State's check finished it first
    saved: Any = None  # what the State's _capture returned, of its subclass's own shape
    saved_in_store: bool = False
    background_commits: bool = False  # TorchState: tensors change only in optimizer.step()
    writer: threading.Thread | None = None
    write_error: BaseException | None = None
    writer_store: StateStore | None = None

    def new_epoch(self) -> None:
        """Forget what belonged to the epoch that ended: its host check and the driver's count of changes."""
        self.known_updates = self.driver_updates = 0
        self.asked_at = float("-inf")
        self.pending_check = self.checked = None
