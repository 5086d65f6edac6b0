"""What the ``"unison"`` process group makes of torch's arguments: reduce ops, call signatures, tensor copies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...errors import InvalidArgumentError, UnisonNotImplementedError
from ...ops import ReduceOp

if TYPE_CHECKING:
    from typing import TypeAlias

    # a torch reduce op as c10d hands it: an options object's ReduceOp, or a member such as ReduceOp.SUM
    _TorchOp: TypeAlias = dist.ReduceOp | dist.ReduceOp.RedOpType

__all__ = ["BITWISE"]

_RED: Any = dist.ReduceOp.RedOpType  # its members are missing from torch's stubs
_OPS = {_RED.SUM: ReduceOp.SUM, _RED.AVG: ReduceOp.AVERAGE, _RED.PRODUCT: ReduceOp.PRODUCT,
        _RED.MIN: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX, _RED.PREMUL_SUM: ReduceOp.SUM}
BITWISE: dict[dist.ReduceOp.RedOpType, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    _RED.BAND: torch.bitwise_and, _RED.BOR: torch.bitwise_or, _RED.BXOR: torch.bitwise_xor}


def _op(reduce_op: _TorchOp, kind: Any = None
        ) -> tuple[ReduceOp | None, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, float]:
    """unison's op (or a local bitwise fold) and the premultiplier of a torch ReduceOp (`kind`: its
    ``.op``, where the caller read it already)."""
    if kind is None:
        kind = getattr(reduce_op, "op", reduce_op)
    known = _PLAIN.get(kind)
    if known is not None:  # every op but PREMUL_SUM, whose factor is the op object's own
        return known
    if kind in BITWISE:
        return None, BITWISE[kind], 1.0
    if kind not in _OPS:
        raise UnisonNotImplementedError(f"The unison backend has no reduce op {kind}.")
    factor = _premul_factor(reduce_op) if kind == _RED.PREMUL_SUM else 1.0
    return _OPS[kind], None, factor


# What `_op` and `_op_key` give for each op kind whose answer does not depend on the op object (a call's
# reduce op is looked up on every call of the group).
_PLAIN: dict[Any, tuple[ReduceOp | None, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, float]] = {
    **{kind: (op, None, 1.0) for kind, op in _OPS.items() if kind != _RED.PREMUL_SUM},
    **{kind: (None, fold, 1.0) for kind, fold in BITWISE.items()}}
_KEYS: dict[Any, tuple[str | float, ...]] = {}


def _premul_factor(reduce_op: _TorchOp) -> float:
    """PREMUL_SUM's factor: ``ReduceOp.factor`` from torch 2.12 on, the pickled state before (2.11 has no
    ``factor``); never 1.0 by default, which would sum unscaled without a word."""
    raw = getattr(reduce_op, "factor", None)
    if raw is None:
        state = getattr(reduce_op, "__getstate__", lambda: ())()
        raw = state[1] if isinstance(state, tuple) and len(state) == 2 else None
    if raw is None:
        raise UnisonNotImplementedError(
            f"The unison backend cannot read the factor of {reduce_op!r} (PREMUL_SUM) in torch {torch.__version__}; "
            "scale the tensor and use ReduceOp.SUM instead.")
    return float(raw.item() if isinstance(raw, torch.Tensor) else raw)


def _sig(tensors: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, ...], torch.dtype, str], ...]:
    """What a call's tensors are, for `CallNames`: shape (a ``torch.Size``, which compares and hashes as
    the tuple), dtype and device type of each. Read on every call: ``Tensor.device`` makes an object, so
    a host tensor's is not asked for."""
    if len(tensors) == 1:
        t = tensors[0]
        return ((t.shape, t.dtype, "cpu" if t.is_cpu else t.device.type),)
    return tuple((t.shape, t.dtype, "cpu" if t.is_cpu else t.device.type) for t in tensors)


def _op_key(reduce_op: _TorchOp | None, kind: Any = None) -> tuple[str | float, ...]:
    """What a reduce op is, for `CallNames` (`kind`: its ``.op``, where the caller read it already)."""
    if reduce_op is None:
        return ()
    if kind is None:
        kind = getattr(reduce_op, "op", reduce_op)
    key = _KEYS.get(kind)
    if key is None:
        key = (str(kind), _op(reduce_op)[2] if kind == _RED.PREMUL_SUM else 1.0)
        if kind != _RED.PREMUL_SUM:
            _KEYS[kind] = key
    return key


def _op_and_key(reduce_op: _TorchOp, kind: Any) -> tuple[
        tuple[ReduceOp | None, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, float],
        tuple[str | float, ...]]:
    """`_op` and `_op_key` of one op (`kind`: its ``.op``) in one lookup: the group's allreduce asks for
    both on every call, and each lookup hashes torch's enum through Python."""
    both = _BOTH.get(kind)
    if both is None:
        return _op(reduce_op, kind), _op_key(reduce_op, kind)
    return both


_BOTH = {kind: (plain, (str(kind), 1.0)) for kind, plain in _PLAIN.items()}


def _point_to_point(call: str) -> UnisonNotImplementedError:
    return UnisonNotImplementedError(
        f"dist.{call} is not available on the unison backend, nor is any point-to-point call (send, recv, "
        "isend, irecv, batch_isend_irecv): unison runs "
        "collectives only. Use dist.broadcast or dist.scatter from the sending rank, or a gloo group for "
        "point-to-point traffic: dist.new_group(backend='gloo')."
    )


def _check_count(call: str, tensors: Sequence[torch.Tensor], size: int) -> None:
    if len(tensors) != size:
        raise InvalidArgumentError(f"{call} needs one tensor per rank of the group ({size}). Got {len(tensors)}.")


def _contiguous(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Contiguous stand-ins for non-contiguous tensors, and the copies back to make at the end."""
    out, copies = [], []
    for tensor in tensors:
        if tensor.is_contiguous():
            out.append(tensor)
        else:
            stand_in = tensor.contiguous()
            out.append(stand_in)
            copies.append((tensor, stand_in))
    return out, copies


def _copy_back(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for tensor, stand_in in copies:
        tensor.copy_(stand_in)


def _keep_at_root(results: list[torch.Tensor], tensors: list[torch.Tensor], root: bool) -> list[torch.Tensor]:
    if root:
        for tensor, result in zip(tensors, results):
            tensor.copy_(result)
    return tensors
