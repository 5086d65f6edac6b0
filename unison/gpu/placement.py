"""Which rank uses which GPU: gathered (host, PCI bus id) pairs checked before NCCL is initialized.

NCCL refuses a communicator in which two ranks use the same device, with "Duplicate GPU detected"
and no word on which ranks. Every rank sends its host and its device's PCI bus id over unison's
control plane first; `duplicate_devices` finds the clash and `placement_table` shows the whole map,
so the error names the ranks and the usual fix (`torch.cuda.set_device(hvd.local_rank())`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["Device", "duplicate_devices", "placement_error", "placement_table"]


@dataclasses.dataclass(frozen=True)
class Device:
    """One rank's GPU: its host, its CUDA ordinal there, and its PCI bus id (unique on the host)."""

    host: str
    ordinal: int
    bus_id: str


def duplicate_devices(devices: Sequence[Device]) -> dict[tuple[str, str], list[int]]:
    """(host, bus id) -> the ranks sharing that device, for devices used by more than one rank.

    Example:
        >>> d = [Device("a", 0, "0000:17:00.0"), Device("a", 0, "0000:17:00.0"), Device("b", 0, "0000:17:00.0")]
        >>> duplicate_devices(d)
        {('a', '0000:17:00.0'): [0, 1]}
    """
    by_device: dict[tuple[str, str], list[int]] = {}
    for rank, device in enumerate(devices):
        by_device.setdefault((device.host, device.bus_id.lower()), []).append(rank)
    return {key: ranks for key, ranks in by_device.items() if len(ranks) > 1}


def placement_table(devices: Sequence[Device]) -> str:
    """The rank -> GPU map, one line per rank, clashing devices marked.

    Example:
        >>> print(placement_table([Device("a", 0, "0000:17:00.0"), Device("a", 0, "0000:17:00.0")]))
        rank 0: a cuda:0 (0000:17:00.0)  <- shared with rank 1
        rank 1: a cuda:0 (0000:17:00.0)  <- shared with rank 0
    """
    clashes = duplicate_devices(devices)
    lines = []
    for rank, device in enumerate(devices):
        line = f"rank {rank}: {device.host} cuda:{device.ordinal} ({device.bus_id})"
        sharing = clashes.get((device.host, device.bus_id.lower()), [])
        others = [r for r in sharing if r != rank]
        if others:
            line += "  <- shared with " + (f"rank {others[0]}" if len(others) == 1 else f"ranks {others}")
        lines.append(line)
    return "\n".join(lines)


def placement_error(devices: Sequence[Device]) -> str:
    """The error text when ranks share a GPU ('' when every rank has its own).

    Example:
        >>> placement_error([Device("a", 0, "x"), Device("a", 1, "y")])
        ''
    """
    clashes = duplicate_devices(devices)
    if not clashes:
        return ""
    groups = "; ".join(f"ranks {ranks} on {host} ({bus_id})" for (host, bus_id), ranks in clashes.items())
    return (
        f"Several ranks use the same GPU, which NCCL refuses: {groups}. Give each rank of a host its own "
        "device before the first GPU collective, e.g. torch.cuda.set_device(hvd.local_rank()) or "
        "cupy.cuda.Device(hvd.local_rank()).use(), and start at most as many ranks per host as it has "
        "GPUs. Rank to GPU:\n" + placement_table(devices)
    )
