"""What in torch made a call of the unison group, read from the frames between the user's line and the group.

The frames are made here with torch's and unison's file names (no torch needed): a group's method (unison's
file, `self` the group), inside DDP's reducer in autograd's backward, inside FSDP2's parameter group, inside
a DDP communication hook.
"""

from __future__ import annotations

import doctest
import os
import sys
from types import FrameType
from typing import Any

from unison.adapters.torch import call_sites
from unison.adapters.torch.call_sites import Buckets, origin

UNISON = os.path.dirname(os.path.dirname(os.path.dirname(call_sites.__file__)))
TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


class Group:
    def __init__(self) -> None:
        self.buckets = Buckets()
        self.calls = -1

    def call_index(self) -> int:
        return self.calls


def _function(path: str, name: str, params: str, body: str) -> Any:
    namespace: dict[str, Any] = {"sys": sys}
    exec(compile(f"def {name}({params}):\n    {body}\n", path, "exec"), namespace)
    return namespace[name]


# group method (unison's file) -> returns the frames from itself out to the test's own frame
_group_call = _function(f"{UNISON}/adapters/torch/_fake_group.py", "allreduce", "self",
                        "return _frames(sys._getframe())")
_group_call.__globals__["_frames"] = lambda frame: _until_test(frame)


def _until_test(frame: FrameType | None) -> list[FrameType]:
    frames = []
    while frame is not None and not frame.f_code.co_filename.endswith("test_torch_call_sites.py"):
        frames.append(frame)
        frame = frame.f_back
    return frames


# torch's functions, each calling the group's method with the group (no frame of this file in between)
_backward = _function(f"{TORCH}/autograd/graph.py", "_engine_run_backward", "t_outputs, call, group",
                      "return call(group)")
_unshard = _function(f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "unshard",
                     "self, call, group", "return call(group)")
_hook = _function(f"{TORCH}/distributed/algorithms/ddp_comm_hooks/default_hooks.py", "allreduce_hook",
                  "process_group, bucket, call, group", "return call(group)")
_sync = _function(f"{TORCH}/distributed/utils.py", "_sync_module_states", "call, group", "return call(group)")


class Loss:
    """A backward pass's first output (weak references work)."""


def _bucket_of(group: Group, loss: Loss) -> str:
    group.calls += 1
    return origin(_backward((loss,), _group_call, group), "allreduce")


def test_ddp_buckets_are_numbered_in_the_order_of_their_allreduces_in_each_backward_pass() -> None:
    group, first, second = Group(), Loss(), Loss()
    assert [_bucket_of(group, first) for _ in range(3)] == ["DDP bucket 0", "DDP bucket 1", "DDP bucket 2"]
    assert [_bucket_of(group, second) for _ in range(2)] == ["DDP bucket 0", "DDP bucket 1"]


def test_a_bucket_after_a_call_that_was_not_read_goes_unnumbered() -> None:
    group, loss = Group(), Loss()
    assert _bucket_of(group, loss) == "DDP bucket 0"
    group.calls += 1  # a call answered from the cache: its site was not read
    assert _bucket_of(group, loss) == "a DDP bucket"
    assert _bucket_of(group, loss) == "a DDP bucket"
    assert _bucket_of(group, Loss()) == "DDP bucket 0"  # the next pass, right after a call that was read


def test_fsdp_s_parameter_group_names_its_module() -> None:
    class ParamGroup:
        _module_fqn = "layers.0"

    frames = _unshard(ParamGroup(), _group_call, Group())
    assert origin(frames, "allgather") == "FSDP's all-gather of module 'layers.0'"
    ParamGroup._module_fqn = ""
    assert origin(_unshard(ParamGroup(), _group_call, Group()), "reducescatter") == \
        "FSDP's reduce-scatter of the root module"


def test_a_communication_hook_s_bucket_and_ddp_s_own_steps() -> None:
    class GradBucket:
        def index(self) -> int:
            return 4

    assert origin(_hook(None, GradBucket(), _group_call, Group()), "allreduce") == "DDP bucket 4"
    assert origin(_sync(_group_call, Group()), "broadcast") == "DDP's broadcast of the module's state"


def test_a_plain_call_has_no_origin() -> None:
    assert origin(_group_call(Group()), "allreduce") == ""


def test_the_examples_hold() -> None:
    assert doctest.testmod(call_sites).failed == 0
