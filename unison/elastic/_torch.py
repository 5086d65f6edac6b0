"""TorchState and ElasticSampler: a model, its optimizer, a sampler and plain values as one elastic state."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sized
from typing import Any

from ._state import SnapshotState

__all__ = ["ElasticSampler", "TorchState"]


def _broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    from .._objects import broadcast_object

    return broadcast_object(obj, root_rank)


def _rank() -> int:
    from .._runtime import rank

    return rank()


def _size() -> int:
    from .._runtime import size

    return size()


class ElasticSampler:
    """A distributed sampler that, after any reset, hands out only the samples this epoch has not yet processed.

    Like Horovod's: shuffled by ``seed + epoch``, the unprocessed indices padded to a multiple of the
    size and dealt out by rank. ``record_batch(i, batch_size)`` records batch ``i`` of *every* rank
    (all ranks step together), so the record in a commit is whole on every host, and after a reset
    the remaining indices are re-dealt over the new size: across any sequence of resets within an
    epoch, every index is recorded exactly once. The padding (at most ``size - 1`` repeats, in the
    last batch) is never recorded.

    Example:
        >>> sampler = ElasticSampler(dataset)                              # doctest: +SKIP
        >>> loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)  # doctest: +SKIP
        >>> state = hvd.elastic.TorchState(model, opt, train_sampler=sampler, epoch=0)   # doctest: +SKIP
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._dealt: list[int] = []  # this iteration's padded order; rank r takes positions r, r + n, ...
        self.reset()

    def __repr__(self) -> str:
        return (f"ElasticSampler(epoch={self.epoch}, processed={len(self.processed_indices)}, "
                f"remaining={len(self.remaining_indices)}, rank={self.rank}/{self.num_replicas})")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record batch `batch_idx` (of `batch_size` samples per rank) of every rank as processed."""
        start = batch_idx * batch_size * self.num_replicas
        end = min((batch_idx + 1) * batch_size * self.num_replicas, len(self.remaining_indices))
        self.processed_indices.update(self._dealt[start:end])

    def record_indices(self, indices: Any) -> None:
        """Record `indices` as processed (this rank's own; the ranks' records are merged at each sync)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch `batch_idx`."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def reset(self) -> None:
        """Deal the unprocessed indices over the current ranks."""
        self.num_replicas = _size()
        self.rank = _rank()
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._deal()

    def _deal(self) -> None:
        order = self.remaining_indices
        if self.shuffle:
            import torch

            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=generator).tolist()]
        padded = list(order)
        while order and len(padded) < self.total_size:
            padded += order[:self.total_size - len(padded)]
        self._dealt = padded
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self._deal()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


class TorchState(SnapshotState):
    """A model, an optimizer and any other values (ElasticSampler, tensors, picklable objects) as attributes.

    Example:
        >>> state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0)  # doctest: +SKIP
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(_broadcast_object, _rank)
        self.model = model
        self.optimizer = optimizer
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()
        if optimizer is not None:
            self._hold_steps_for_commits(optimizer)

    def _hold_steps_for_commits(self, optimizer: Any) -> None:
        """Write commits in the background, finishing each before the optimizer changes a parameter."""
        step = optimizer.step

        def step_after_commit(*args: Any, **kwargs: Any) -> Any:
            self.finish_commit()
            return step(*args, **kwargs)

        optimizer.step = step_after_commit
        self._background_commits = True

    def _capture(self) -> Any:
        values: dict[str, Any] = {}
        for name in self._names:
            value = getattr(self, name)
            values[name] = ("sampler", value.state_dict()) if isinstance(value, ElasticSampler) else ("value", value)
        if self._background_commits:  # written while the next step runs: only the model and optimizer
            values = copy.deepcopy(values)  # tensors wait for optimizer.step(); other values are copied now
        return {"model": self.model.state_dict() if self.model is not None else None,
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "values": values}

    def _apply(self, values: Any) -> None:
        if self.model is not None and values["model"] is not None:
            self.model.load_state_dict(values["model"])
        if self.optimizer is not None and values["optimizer"] is not None:
            self.optimizer.load_state_dict(values["optimizer"])
        for name, (kind, value) in values["values"].items():
            if kind == "sampler":
                getattr(self, name).load_state_dict(value)
            else:
                setattr(self, name, value)

    def sync(self, root_rank: int = 0) -> None:
        """Give every rank `root_rank`'s values; samplers first merge every rank's recorded indices."""
        from .._objects import allgather_object

        for name in self._names:
            sampler = getattr(self, name)
            if isinstance(sampler, ElasticSampler):
                merged: set[int] = set()
                for indices in allgather_object(sorted(sampler.processed_indices)):
                    merged.update(indices)
                sampler.processed_indices = merged
                sampler.reset()
        super().sync(root_rank)
