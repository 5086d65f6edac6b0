"""The GPU data plane's device-neutral rules, on CPU: the rank -> GPU check, and the communicator cache."""

from __future__ import annotations

import subprocess
import sys

import pytest

from unison.gpu.communicators import CommunicatorCache
from unison.gpu.placement import Placement, duplicate_devices, placement_error, placement_table


def test_every_rank_on_its_own_gpu_is_fine() -> None:
    devices = [Placement("node1", 0, "0000:17:00.0"), Placement("node1", 1, "0000:65:00.0"),
               Placement("node2", 0, "0000:17:00.0")]  # the same bus id on another host is another GPU
    assert duplicate_devices(devices) == {} and placement_error(devices) == ""


def test_two_ranks_on_one_gpu_are_named_with_the_table() -> None:
    devices = [Placement("node1", 0, "0000:17:00.0"), Placement("node1", 0, "0000:17:00.0"),
               Placement("node1", 1, "0000:65:00.0"), Placement("node1", 1, "0000:65:00.0".upper())]
    text = placement_error(devices)
    assert text.startswith("Several ranks use the same GPU, which NCCL refuses: ranks [0, 1] on node1 "
                           "(0000:17:00.0); ranks [2, 3] on node1 (0000:65:00.0).")
    assert "torch.cuda.set_device(hvd.local_rank())" in text and "cupy.cuda.Device(hvd.local_rank()).use()" in text
    assert text.endswith(placement_table(devices))
    assert "rank 3: node1 cuda:1 (0000:65:00.0)  <- shared with rank 2" in placement_table(devices)


def test_three_ranks_on_one_gpu() -> None:
    table = placement_table([Placement("h", 0, "b")] * 3)
    assert table.splitlines()[0] == "rank 0: h cuda:0 (b)  <- shared with ranks [1, 2]"


def test_a_communicator_is_made_once_per_set_and_device() -> None:
    made: list[tuple[int, int, tuple[int, ...], int]] = []
    closed: list[str] = []

    def make(set_id, device, members, index):  # type: ignore[no-untyped-def]
        made.append((set_id, device, tuple(members), index))
        return f"comm{set_id}.{device}"

    cache: CommunicatorCache[str] = CommunicatorCache(make, closed.append)
    assert cache.get(0, 0, [2, 0, 1], rank=2) == "comm0.0"
    assert cache.get(0, 0, [0, 1, 2], rank=2) == "comm0.0"
    assert cache.get(0, 1, [0, 1, 2], rank=2) == "comm0.1"  # another device: another communicator
    assert cache.get(3, 0, [1, 2], rank=2) == "comm3.0"
    assert made == [(0, 0, (0, 1, 2), 2), (0, 1, (0, 1, 2), 2), (3, 0, (1, 2), 1)]
    assert cache.statistics() == {"made": 3, "hits": 1, "closed": 0, "open": 3}
    cache.drop_set(0)
    assert sorted(closed) == ["comm0.0", "comm0.1"]
    assert cache.get(0, 0, [0, 1, 2], rank=2) == "comm0.0" and len(made) == 4  # made again after removal
    cache.close()
    assert sorted(closed) == ["comm0.0", "comm0.0", "comm0.1", "comm3.0"]
    assert CommunicatorCache.id_maker([5, 3, 9]) == 3


def test_a_non_member_never_makes_a_communicator() -> None:
    cache: CommunicatorCache[str] = CommunicatorCache(lambda *a: "c", lambda c: None)
    with pytest.raises(ValueError, match=r"rank 4 asked for the communicator of process set 2, whose members are \[0, 1\]"):
        cache.get(2, 0, [1, 0], rank=4)


def test_nothing_gpu_is_imported() -> None:
    code = ("import sys, unison.gpu.communicators, unison.gpu.placement; "
            "print(sorted(m for m in ('cupy', 'torch', 'tensorflow', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
