"""PyTorch on parameter servers: an embedding held by the servers, and an optimizer that trains through them.

`DistributedEmbedding` stands in for ``nn.Embedding`` (``mode=None``) or ``nn.EmbeddingBag``
(``mode="sum"``/``"mean"``): its forward pulls only the rows of the batch's unique ids and its
backward keeps only their gradients, which `ServerOptimizer.step` pushes with the dense gradients
and then pulls the updated dense parameters.

Example:
    >>> import unison.ps as ps, unison.ps.torch as pst                          # doctest: +SKIP
    >>> ps.init()                                                               # doctest: +SKIP
    >>> model = nn.Sequential(pst.DistributedEmbedding("emb", 1_000_000, 16, mode="sum"), nn.Linear(16, 1))
    >>> opt = pst.ServerOptimizer(model, ps.Adam(0.01))                          # doctest: +SKIP
    >>> loss = model(ids).sum(); loss.backward(); opt.step()                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import MissingDependencyError, RequestError
from ...ps import _api
from ...ps._ids import table_ids
from ...ps.client import Client
from ...ps.optim import Optimizer
from ...ps.table import Initializer

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as exc:  # pragma: no cover - torch is optional
    raise MissingDependencyError("unison.ps.torch needs PyTorch: `pip install torch`.") from exc

__all__ = ["DistributedEmbedding", "ServerOptimizer"]


class DistributedEmbedding(nn.Module):
    """An embedding table that lives on the parameter servers, looked up like ``nn.Embedding``/``EmbeddingBag``.

    Args:
        name: the table's name on the servers (the same on every trainer).
        num_embeddings: the table's capacity: the most distinct ids it holds (ids are any int64).
        embedding_dim: the width of a row.
        mode: None for ``nn.Embedding``'s lookup; ``"sum"`` or ``"mean"`` for ``nn.EmbeddingBag``'s.
        initializer: how rows start (default: uniform in [-0.05, 0.05)).
        optimizer: applied by the servers to this table's rows (default: SGD).
        client: the connection to use (default: the one `unison.ps.init` made).
    """

    def __init__(self, name: str, num_embeddings: int, embedding_dim: int, *, mode: str | None = None,
                 initializer: Initializer | None = None, optimizer: Optimizer | None = None,
                 client: Client | None = None) -> None:
        super().__init__()
        if mode not in (None, "sum", "mean"):
            raise ValueError(f"mode must be None, 'sum' or 'mean'. Got mode={mode!r}.")
        self.name, self.num_embeddings, self.embedding_dim, self.mode = name, num_embeddings, embedding_dim, mode
        self._client = client
        self._initializer, self._optimizer = initializer, optimizer
        self._declared = False
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # (unique ids, their gradient rows)

    def extra_repr(self) -> str:
        return f"{self.name!r}, {self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"

    @property
    def client(self) -> Client:
        return self._client or _api.client()

    def _declare(self) -> None:
        if not self._declared:
            self.client.declare_table(self.name, self.embedding_dim, self.num_embeddings,
                                      initializer=self._initializer, optimizer=self._optimizer)
            self._declared = True

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        given = input.detach().cpu()
        shown = None
        if given.dtype == torch.bfloat16:  # NumPy has no bfloat16: read as float32, refused as bfloat16
            given, shown = given.float(), str(input.dtype)
        ids = table_ids(self.name, given.numpy(), shown)  # before anything is sent
        self._declare()
        unique, inverse = np.unique(ids.reshape(-1), return_inverse=True)
        rows = self.client.pull(sparse={self.name: unique})[1][self.name]
        weight = torch.from_numpy(rows)
        if torch.is_grad_enabled() and self.training:
            weight.requires_grad_(True)
            weight.register_hook(lambda grad: self._keep(unique, grad))
        index = torch.from_numpy(inverse.reshape(ids.shape)).to(input.device)
        weight = weight.to(input.device)
        if self.mode is None:
            return F.embedding(index, weight)
        return F.embedding_bag(index, weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def _keep(self, unique: np.ndarray, grad: torch.Tensor) -> None:
        self.pending.append((unique, grad.detach().cpu().numpy()))

    def take_gradients(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The gradients kept since the last call, as (ids, rows), or None when there are none."""
        if not self.pending:
            return None
        ids = np.concatenate([i for i, _ in self.pending])
        rows = np.concatenate([g for _, g in self.pending]).reshape(len(ids), self.embedding_dim)
        self.pending = []
        return ids, rows


def _parameter_changes(declared: dict[str, tuple[int, ...]], held: dict[str, tuple[int, tuple[int, ...]]],
                      now: dict[str, tuple[int, tuple[int, ...]]]) -> list[str]:
    """What changed in a model since its parameters were declared, as text ([] when nothing did).

    Args:
        declared: each declared parameter's shape, by name.
        held: (object id, shape) of the parameter objects the optimizer holds, by name.
        now: (object id, shape) of the model's trainable parameters now, by name.

    Example:
        >>> _parameter_changes({"w": (1, 4)}, {"w": (7, (1, 4))}, {"w": (8, (1, 8))})
        ["'w' has shape (1, 8) now (declared (1, 4)), and is another tensor than the one declared"]
    """
    changes = []
    for name, shape in declared.items():
        if name not in now:
            changes.append(f"{name!r} is no longer a trainable parameter of the model")
            continue
        ident, current = now[name]
        what = []
        if current != shape or held[name][1] != shape:
            what.append(f"has shape {current} now (declared {shape})")
        if ident != held[name][0]:
            what.append("is another tensor than the one declared")
        if what:
            changes.append(f"{name!r} " + ", and ".join(what))
    changes += [f"{name!r} is new (shape {now[name][1]}) and was never declared" for name in now if name not in declared]
    return changes


class ServerOptimizer:
    """Train a model's dense parameters and distributed embeddings through the parameter servers.

    The model's parameters are declared on the servers (trainer 0's values start them) and
    replaced by the servers' values. Each `step` pushes this trainer's gradients and pulls the
    updated parameters; in synchronous mode that pull waits for every trainer's step.

    Args:
        model: the module to train.
        optimizer: what the servers apply to the dense parameters (tables use their own).
        client: the connection to use (default: the one `unison.ps.init` made).
    """

    def __init__(self, model: nn.Module, optimizer: Optimizer | None = None, *, client: Client | None = None) -> None:
        self.model = model
        self._client = client
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        self.embeddings = [m for m in model.modules() if isinstance(m, DistributedEmbedding)]
        self.shapes = {name: tuple(p.shape) for name, p in self.params.items()}
        self.client.declare_dense({n: p.detach().cpu().numpy() for n, p in self.params.items()}, optimizer)
        self.pull()

    def __repr__(self) -> str:
        return f"<ServerOptimizer params={len(self.params)} embeddings={len(self.embeddings)} {self.client!r}>"

    @property
    def client(self) -> Client:
        return self._client or _api.client()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params.values():
            p.grad = None
        for emb in self.embeddings:
            emb.pending = []

    def pull(self) -> None:
        """Replace the model's dense parameters with the servers' values."""
        values = self.client.pull_dense(list(self.params))
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(values[name]))

    def step(self, closure: Callable[[], object] | None = None) -> None:
        """Push this step's gradients (dense and the embeddings' rows), then pull the updated parameters."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        changed = _parameter_changes(self.shapes, {n: (id(p), tuple(p.shape)) for n, p in self.params.items()},
                                    {n: (id(p), tuple(p.shape)) for n, p in self.model.named_parameters()
                                     if p.requires_grad})
        if changed:
            raise RequestError("ServerOptimizer trains the parameters the model had when it was made, with their "
                               "shapes then; " + "; ".join(changed) + ". Nothing was pushed. Make the model's "
                               "final parameters first, then the ServerOptimizer (a parameter that changes shape "
                               "needs a new name: the servers hold it with its first shape).")
        dense = {name: (p.grad.detach().cpu().numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32))
                 for name, p in self.params.items()}
        sparse = {}
        for emb in self.embeddings:
            taken = emb.take_gradients()
            if taken is not None:
                sparse[emb.name] = taken
        self.client.push(dense=dense, sparse=sparse)
        self.pull()

    def statistics(self) -> dict[str, float]:
        """The client's counters (calls, bytes, rows, seconds)."""
        return self.client.statistics()
