"""What in torch made a collective of the ``"unison"`` group: DDP bucket N, FSDP's all-gather of module M.

torch's collectives carry no names, so the group names its calls by their order (`call_names`), and a
message that said only ``allreduce.torch.pg.p16.8`` would leave the reader to count. A request the
submit path makes afresh (a first call or a changed one: never one the response cache answers) reads
its site (`unison.engine.where.call_site`), which asks `origin` here what, between the user's frame and
the group, made the call, from the frames in between:

| frames between the user's line and the group | origin |
|---|---|
| FSDP2's ``FSDPParamGroup`` (``fully_shard``) | ``FSDP's all-gather of module 'layers.0'`` (reduce-scatter, all-reduce) |
| FSDP's flat parameters (``FullyShardedDataParallel``) | ``FSDP's all-gather (_all_gather_flat_param)`` |
| a DDP communication hook's ``GradBucket`` | ``DDP bucket 3`` |
| DDP's own steps (``torch/nn/parallel/distributed.py``, its helpers) | ``DDP's broadcast of the module's state``... |
| autograd's backward, an allreduce with no hook in between (DDP's reducer) | ``DDP bucket 3`` |
| ZeroRedundancyOptimizer, Join | ``ZeroRedundancyOptimizer's <function>``, ``Join's <function>`` |

DDP's reducer starts its buckets' allreduces in bucket order within each backward pass, so the n-th
allreduce of a pass is bucket n. The group counts them per pass (`Buckets`) from the calls whose site
is read; every call is read until the names recur (`call_names`), so the count is exact there, and
where a call in between was not read the bucket goes unnumbered rather than misnumbered.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Any

__all__ = ["Buckets", "origin"]

_WORDS = {"allgather": "all-gather", "reducescatter": "reduce-scatter", "allreduce": "all-reduce",
          "broadcast": "broadcast", "alltoall": "all-to-all"}
_DDP_STEPS = {
    "_verify_param_shape_across_processes": "check of parameter shapes",
    "_sync_module_states": "broadcast of the module's state",
    "_sync_params_and_buffers": "broadcast of the module's state",
    "_sync_buffers": "broadcast of buffers",
    "_sync_module_buffers": "broadcast of buffers",
    "_default_broadcast_coalesced": "broadcast of buffers",
    "_pre_forward": "bucket rebuild",
    "_check_global_requires_backward_grad_sync": "check of gradient sync (Join)",
    "_match_all_reduce_for_bwd_pass": "shadow all-reduce (Join)",
    "_match_unused_params_allreduce": "shadow all-reduce of unused parameters (Join)",
}
_DDP_FILE = "/torch/nn/parallel/distributed.py"
_DDP_HELPERS = "/torch/distributed/utils.py"
_FSDP_DIR = "/torch/distributed/fsdp/"
_BACKWARD = ("/torch/autograd/graph.py", "_engine_run_backward")
_UNISON = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # unison/


class Buckets:
    """DDP's bucket numbers of one group, from the order of the calls whose sites were read.

    Example:
        >>> buckets, loss, later = Buckets(), object(), object()
        >>> [buckets.number(call, loss) for call in (0, 1, 2)], buckets.number(3, later), buckets.number(7, later)
        ([0, 1, 2], 0, None)
    """

    __slots__ = ("_bucket", "_call", "_pass")

    def __init__(self) -> None:
        self._call = -1  # the group's last call whose site was read
        self._pass: Any = None  # what identifies its backward pass (a weak reference), None outside one
        self._bucket: int | None = None

    def __repr__(self) -> str:
        return f"<Buckets call={self._call} bucket={self._bucket}>"

    def seen(self, call: int) -> None:
        """Call `call`'s site was read, and it is no allreduce of a backward pass."""
        if call != self._call:
            self._call, self._pass, self._bucket = call, None, None

    def number(self, call: int, backward: object) -> int | None:
        """The bucket of call `call`, an allreduce in the backward pass `backward` (its first output); None
        where a call before it in the pass was not read."""
        if call == self._call:  # the same call's next tensor
            return self._bucket
        same = self._pass is not None and _target(self._pass) is backward
        bucket = None
        if call == self._call + 1:
            bucket = 0 if not same else None if self._bucket is None else self._bucket + 1
        self._call, self._pass, self._bucket = call, _reference(backward), bucket
        return bucket


def _reference(thing: object) -> Any:
    try:
        return weakref.ref(thing)
    except TypeError:  # no weak references (a GradientEdge): kept while the pass lasts at most
        return lambda: thing


def _target(reference: Any) -> object:
    return reference()


def origin(frames: Sequence[FrameType], kind: str) -> str:
    """What in torch made the call: see the module's table; '' for a plain ``dist.*`` call.

    Args:
        frames: the frames from the submission out to the user's frame, innermost first (unison's own
            among them).
        kind: the collective's kind (``allreduce``, ``allgather``...).
    """
    group = None
    for frame in frames:
        code = frame.f_code
        if code.co_filename.startswith(_UNISON):
            if group is None:  # the group's own method: its call counter and bucket numbers
                owner = frame.f_locals.get("self")
                if isinstance(getattr(owner, "buckets", None), Buckets):
                    group = owner
            continue
        path, function = code.co_filename.replace("\\", "/"), code.co_name
        if "/torch/" not in path:
            continue
        if _FSDP_DIR in path:
            described = _fsdp(frame, kind, function)
            if described:
                return _seen(group, described)
            continue
        bucket = frame.f_locals.get("bucket")
        if bucket is not None and callable(getattr(bucket, "index", None)):  # a DDP communication hook
            return _seen(group, f"DDP bucket {bucket.index()}")
        if (path.endswith(_DDP_FILE) or path.endswith(_DDP_HELPERS)) and function in _DDP_STEPS:
            return _seen(group, f"DDP's {_DDP_STEPS[function]}")
        if path.endswith(_DDP_FILE):
            return _seen(group, f"DDP's {function}")
        if "/zero_redundancy_optimizer.py" in path:
            return _seen(group, f"ZeroRedundancyOptimizer's {function}")
        if path.endswith("/torch/distributed/algorithms/join.py"):
            return _seen(group, f"Join's {function}")
        if path.endswith(_BACKWARD[0]) and function == _BACKWARD[1] and kind == "allreduce":
            return _bucket(group, frame)
    return _seen(group, "")


def _seen(group: Any, described: str) -> str:
    if group is not None:
        group.buckets.seen(group.call_index())
    return described


def _bucket(group: Any, frame: FrameType) -> str:
    """A DDP bucket's allreduce inside autograd's backward: its number within the pass."""
    if group is None:
        return "a DDP bucket"
    outputs = frame.f_locals.get("t_outputs")
    first = outputs[0] if isinstance(outputs, (list, tuple)) and outputs else outputs
    number = group.buckets.number(group.call_index(), first)
    return "a DDP bucket" if number is None else f"DDP bucket {number}"


def _fsdp(frame: FrameType, kind: str, function: str) -> str:
    words = _WORDS.get(kind, kind)
    owner = frame.f_locals.get("self")
    fqn = getattr(owner, "_module_fqn", None)
    if isinstance(fqn, str):  # FSDP2's parameter group of one module
        return f"FSDP's {words} of module '{fqn}'" if fqn else f"FSDP's {words} of the root module"
    flat = getattr(owner, "flat_param", None)
    names = getattr(flat, "_fqns", None)
    if isinstance(names, (list, tuple)) and names:  # FSDP's flat parameter of one wrapped module
        shown = ", ".join(str(name) for name in names[:2]) + (", ..." if len(names) > 2 else "")
        return f"FSDP's {words} of {shown}"
    return ""
