"""TorchState and ElasticSampler: a model, its optimizer, a sampler and plain values as one elastic state."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Any

from ...elastic._state import SnapshotState

if TYPE_CHECKING:
    from typing import TypedDict

    import torch
    from torch.optim.optimizer import StateDict

    class _Snapshot(TypedDict):
        """What `TorchState` commits: the state dicts (torch's type for them) and the other values."""

        model: dict[str, Any] | None
        optimizer: StateDict | None
        values: dict[str, tuple[str, object]]  # name -> ("sampler", its state_dict) or ("value", the value)

__all__ = ["ElasticSampler", "TorchState"]


def _broadcast_object(obj: object, root_rank: int = 0) -> object:
    from ..._job.objects import broadcast_object

    return broadcast_object(obj, root_rank)


def _rank() -> int:
    from ..._job.runtime import rank

    return rank()


def _size() -> int:
    from ..._job.runtime import size

    return size()


class ElasticSampler:
    """A distributed sampler that, after any reset, hands out only the samples this epoch has not yet processed.

    Horovod 0.28's: each epoch's order is ``range(len(dataset))`` shuffled by ``random.Random(seed +
    epoch)`` (or kept in order), and ``processed_num`` counts how many of its first indices were
    processed. ``record_batch(batch_idx, batch_size)`` adds one batch of every rank, ``batch_size *
    size`` (all ranks step together, so the count is the same on every rank and in every host's
    commit; `batch_idx` is not used). The rest of the order is padded to a multiple of the size and
    dealt out by rank (rank r takes positions r, r + size, ...), so after a reset, whatever the new
    size, the remaining indices are dealt again and every index is processed exactly once per epoch.
    The padding (at most ``size - 1`` repeats, in the last batch) counts towards ``processed_num``
    only as the end of the epoch. ``state_dict()`` is ``{'epoch', 'processed_num'}``, so a state saved
    by Horovod 0.28 loads here and gives the same indices.

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
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._order: list[int] = []  # the epoch's order; remaining_indices is what follows processed_num
        self.reset()

    def __repr__(self) -> str:
        return (f"ElasticSampler(epoch={self.epoch}, processed_num={self.processed_num}, "
                f"remaining={len(self.remaining_indices)}, rank={self.rank}/{self.num_replicas})")

    @property
    def processed_indices(self) -> set[int]:
        """The indices processed so far this epoch: the first `processed_num` of the epoch's order."""
        return set(self._order[:self.processed_num])

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` (its own shuffle): nothing processed yet. Call it at the end of an epoch."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record one batch (`batch_size` samples per rank) of every rank as processed; `batch_idx` is not used."""
        self.processed_num += batch_size * self.num_replicas

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch `batch_idx` of what is left of the epoch."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Take a `state_dict()` (``{'epoch', 'processed_num'}``, the form Horovod 0.28 saves)."""
        if not isinstance(state_dict, dict) or "epoch" not in state_dict or "processed_num" not in state_dict:
            keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError("ElasticSampler.load_state_dict needs {'epoch': E, 'processed_num': N} (what "
                             f"state_dict() returns, as in Horovod 0.28). Got {keys}.")
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def state_dict(self) -> dict[str, int]:
        """``{'epoch': ..., 'processed_num': ...}``."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        """Deal what is left of the epoch over the current ranks."""
        self.num_replicas = _size()
        self.rank = _rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self._order = order
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._deal()

    def _deal(self) -> None:
        remaining = self.remaining_indices
        padded = list(remaining)
        while remaining and len(padded) < self.total_size:
            padded += remaining[:self.total_size - len(padded)]
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

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: object) -> None:
        super().__init__(_broadcast_object, _rank)
        self.model = model
        self.optimizer = optimizer
        self._set_values(kwargs)
        self.save()
        if optimizer is not None:
            self._hold_steps_for_commits(optimizer)

    # `optimizer` is Any: mypy refuses assigning to a method, and its step is replaced on the instance
    def _hold_steps_for_commits(self, optimizer: Any) -> None:
        """Write commits in the background, finishing each before the optimizer changes a parameter."""
        step = optimizer.step

        def step_after_commit(*args: object, **kwargs: object) -> object:
            self.finish_commit()
            return step(*args, **kwargs)

        optimizer.step = step_after_commit
        self._books.background_commits = True

    def _capture(self) -> _Snapshot:
        values: dict[str, tuple[str, object]] = {}
        for name in self._books.names:
            value = getattr(self, name)
            values[name] = ("sampler", value.state_dict()) if isinstance(value, ElasticSampler) else ("value", value)
        if self._books.background_commits:  # written while the next step runs: only the model and optimizer
            values = copy.deepcopy(values)  # tensors wait for optimizer.step(); other values are copied now
        return {"model": self.model.state_dict() if self.model is not None else None,
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "values": values}

    def _apply(self, values: _Snapshot) -> None:
        if self.model is not None and values["model"] is not None:
            self.model.load_state_dict(values["model"])
        if self.optimizer is not None and values["optimizer"] is not None:
            self.optimizer.load_state_dict(values["optimizer"])
        for name, (kind, value) in values["values"].items():
            if kind == "sampler":
                getattr(self, name).load_state_dict(value)
            else:
                setattr(self, name, value)
