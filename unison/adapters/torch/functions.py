"""Initial-state helpers: broadcast a model's parameters and an optimizer's state from one rank.

`broadcast_optimizer_state` never runs a dummy ``step()`` (Horovod's does, which changes Adam's
state): the root's ``state_dict()`` travels as one pickled skeleton (hyperparameters, scalars, and the
shape/dtype of every state tensor) plus one in-place broadcast per state tensor; the other ranks
build the same ``state_dict`` and call ``load_state_dict``. State that the root has not created yet
(before the first step) is therefore cleared on the other ranks too, so every rank ends identical.
Afterwards every parameter that requires a gradient has a ``.grad``, zeros where it had none, as
after Horovod's dummy step: code that reads ``p.grad`` right after the call keeps working.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from ..._job.objects import broadcast_object
from ..._job.runtime import job
from ...errors import InvalidArgumentError
from . import collectives as c

if TYPE_CHECKING:
    from torch.optim.optimizer import StateDict

__all__ = ["broadcast_optimizer_state", "broadcast_parameters"]


def broadcast_parameters(
        params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor] | torch.Tensor],
        root_rank: int) -> None:
    """Overwrite every rank's tensors with `root_rank`'s, in place.

    Args:
        params: ``model.state_dict()`` (broadcast by sorted key), ``model.named_parameters()`` or a
            list of ``(name, tensor)`` pairs or of tensors.
        root_rank: the global rank whose values everyone takes.

    Example:
        >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)   # doctest: +SKIP
    """
    if isinstance(params, Mapping):
        items: list[tuple[str | None, object]] = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor | str):
        items = []
        for p in params:
            if isinstance(p, tuple) and len(p) == 2:
                items.append((p[0], p[1]))
            elif isinstance(p, torch.Tensor):
                items.append((None, p))
            else:
                raise InvalidArgumentError(
                    f"invalid params of type: {type(p)}: expected tensors or (name, tensor) pairs."
                )
    else:
        raise InvalidArgumentError(f"invalid params of type: {type(params)}")
    handles, copies = [], []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(
                f"broadcast_parameters can only broadcast tensors; {name!r} is a {type(tensor).__name__}."
            )
        target = tensor.data if tensor.is_contiguous() else tensor.detach().contiguous()
        if target is not tensor.data:
            copies.append((tensor, target))
        handles.append(c.broadcast_async_(target, root_rank, None if name is None else str(name)))
    for handle in handles:
        c.synchronize(handle)
    with torch.no_grad():
        for tensor, target in copies:
            tensor.copy_(target)


def _skeleton(state_dict: StateDict) -> StateDict:
    """Replace every state tensor by (shape, dtype) so the structure can be pickled cheaply."""
    state = {
        pid: {key: (("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ("value", v))
              for key, v in entry.items()}
        for pid, entry in state_dict["state"].items()
    }
    return {"state": state, "param_groups": state_dict["param_groups"]}


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Make every rank's optimizer state and hyperparameters equal to `root_rank`'s.

    Works for every ``torch.optim`` optimizer except LBFGS, before or after the first step, without
    running ``step()``. `model` is accepted for Horovod compatibility and not needed.

    Example:
        >>> hvd.broadcast_optimizer_state(opt, root_rank=0)   # doctest: +SKIP
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise InvalidArgumentError("cannot broadcast torch.optim.LBFGS state")
    is_root = job().rank == root_rank
    own = optimizer.state_dict()
    skeleton = broadcast_object(_skeleton(own) if is_root else None, root_rank,
                                name="broadcast_optimizer_state")
    if len(skeleton["param_groups"]) != len(own["param_groups"]) or any(
        len(a["params"]) != len(b["params"]) for a, b in zip(skeleton["param_groups"], own["param_groups"])
    ):
        raise InvalidArgumentError(
            "broadcast_optimizer_state: the optimizer's parameter groups differ from root rank "
            f"{root_rank}'s: group sizes {[len(g['params']) for g in own['param_groups']]} here, "
            f"{[len(g['params']) for g in skeleton['param_groups']]} on the root. Build the optimizer "
            "the same way on every rank."
        )
    state: dict[object, dict[str, object]] = {}  # by the root's keys (parameter indices)
    handles = []
    for pid in sorted(skeleton["state"], key=str):
        entry: dict[str, object] = {}
        for key in sorted(skeleton["state"][pid]):
            kind, *info = skeleton["state"][pid][key]
            if kind == "value":
                entry[key] = info[0]
                continue
            shape, dtype = info
            if is_root:
                tensor = own["state"][pid][key].detach()
                tensor = tensor if tensor.is_contiguous() and tensor.device.type == "cpu" else tensor.cpu().contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype)
            entry[key] = tensor
            handles.append(c.broadcast_async_(tensor, root_rank, f"optimizer_state.{pid}.{key}"))
        state[pid] = entry
    for handle in handles:
        c.synchronize(handle)
    if not is_root:
        optimizer.load_state_dict({"state": state, "param_groups": skeleton["param_groups"]})
    _zero_missing_grads(optimizer)


def _zero_missing_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give each trainable parameter without a ``.grad`` a zero one (sparse for SparseAdam, as Horovod).

    Gradients that exist are left alone, and nothing else is touched: no step, no state.
    """
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
                p.grad = zeros.to_sparse() if sparse else zeros
