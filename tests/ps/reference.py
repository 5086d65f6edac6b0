"""The model and data of the synchronous-equivalence test, shared by its trainers and its reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn


def make_model(embedding: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    head = [nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)]  # before the embedding: it may draw from the seed
    return nn.Sequential(embedding(), *head)


def batches(steps: int = 6, size: int = 16) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    for _ in range(steps):
        ids = rng.integers(0, 64, size=(size, 3)).astype(np.int64)
        yield ids, rng.standard_normal((size, 1)).astype(np.float32)
