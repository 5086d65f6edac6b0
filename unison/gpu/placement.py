"""Which rank uses which GPU: gathered (host, PCI bus id) pairs checked before NCCL is initialized.

NCCL refuses a communicator in which two ranks use the same device, with "Duplicate GPU detected"
and no word on which ranks. Every rank sends its host and its device's PCI bus id over unison's
control plane first; `duplicate_devices` finds the clash and `placement_table` shows the whole map,
so the error names the ranks and the usual fix (`torch.cuda.set_device(hvd.local_rank())`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = [
    "RECORD_BYTES", "Placement", "decode_placements", "duplicate_devices", "encode_placement", "placement_error",
    "placement_table",
]

# One rank's placement on the wire: host (up to 64 bytes of UTF-8), bus id (up to 28), ordinal (4).
RECORD_BYTES = 96


@dataclasses.dataclass(frozen=True)
class Placement:
    """One rank's GPU: its host, its CUDA ordinal there, and its PCI bus id (unique on the host)."""

    host: str
    ordinal: int
    bus_id: str


def encode_placement(placement: Placement) -> bytes:
    """The fixed-size record every member sends before a communicator is made (`RECORD_BYTES`).

    Example:
        >>> decode_placements(encode_placement(Placement("node1", 3, "0000:17:00.0")) * 2)[1]
        Placement(host='node1', ordinal=3, bus_id='0000:17:00.0')
    """
    host = placement.host.encode()[:64].ljust(64, b"\0")
    bus_id = placement.bus_id.encode()[:28].ljust(28, b"\0")
    return host + bus_id + placement.ordinal.to_bytes(4, "little", signed=True)


def decode_placements(records: bytes) -> list[Placement]:
    """Split gathered records (`encode_placement`, in set-rank order) back into placements."""
    placements = []
    for start in range(0, len(records), RECORD_BYTES):
        record = records[start : start + RECORD_BYTES]
        placements.append(Placement(record[:64].rstrip(b"\0").decode(errors="replace"),
                                    int.from_bytes(record[92:96], "little", signed=True),
                                    record[64:92].rstrip(b"\0").decode(errors="replace")))
    return placements


def duplicate_devices(devices: Sequence[Placement],
                      ranks: Sequence[int] | None = None) -> dict[tuple[str, str], list[int]]:
    """(host, bus id) -> the ranks sharing that device, for devices used by more than one rank.

    `ranks` names the global rank of each entry (default: its index).

    Example:
        >>> d = [Placement("a", 0, "0000:17:00.0"), Placement("a", 0, "0000:17:00.0"), Placement("b", 0, "0000:17:00.0")]
        >>> duplicate_devices(d)
        {('a', '0000:17:00.0'): [0, 1]}
    """
    by_device: dict[tuple[str, str], list[int]] = {}
    for rank, device in zip(ranks if ranks is not None else range(len(devices)), devices):
        by_device.setdefault((device.host, device.bus_id.lower()), []).append(rank)
    return {key: sharing for key, sharing in by_device.items() if len(sharing) > 1}


def placement_table(devices: Sequence[Placement], ranks: Sequence[int] | None = None) -> str:
    """The rank -> GPU map, one line per rank, clashing devices marked.

    Example:
        >>> print(placement_table([Placement("a", 0, "0000:17:00.0"), Placement("a", 0, "0000:17:00.0")]))
        rank 0: a cuda:0 (0000:17:00.0)  <- shared with rank 1
        rank 1: a cuda:0 (0000:17:00.0)  <- shared with rank 0
    """
    clashes = duplicate_devices(devices, ranks)
    lines = []
    for rank, device in zip(ranks if ranks is not None else range(len(devices)), devices):
        line = f"rank {rank}: {device.host} cuda:{device.ordinal} ({device.bus_id})"
        sharing = clashes.get((device.host, device.bus_id.lower()), [])
        others = [r for r in sharing if r != rank]
        if others:
            line += "  <- shared with " + (f"rank {others[0]}" if len(others) == 1 else f"ranks {others}")
        lines.append(line)
    return "\n".join(lines)


def placement_error(devices: Sequence[Placement], ranks: Sequence[int] | None = None) -> str:
    """The error text when ranks share a GPU ('' when every rank has its own).

    Example:
        >>> placement_error([Placement("a", 0, "x"), Placement("a", 1, "y")])
        ''
    """
    clashes = duplicate_devices(devices, ranks)
    if not clashes:
        return ""
    groups = "; ".join(f"ranks {ranks} on {host} ({bus_id})" for (host, bus_id), ranks in clashes.items())
    return (
        f"Several ranks use the same GPU, which NCCL refuses: {groups}. Give each rank of a host its own "
        "device before the first GPU collective, e.g. torch.cuda.set_device(hvd.local_rank()) or "
        "cupy.cuda.Device(hvd.local_rank()).use(), and start at most as many ranks per host as it has "
        "GPUs. Rank to GPU:\n" + placement_table(devices, ranks)
    )
