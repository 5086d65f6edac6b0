"""Decide each Ray worker's place in the job (rank, local and cross ranks) and the variables it starts with (pure).

Ray places actors where its placement group has room, so the order in which they were made says
nothing about their nodes. `place` numbers them again: the nodes in the order their first worker
appeared, each node's workers on consecutive ranks, so that rank 0 is the first worker made and
``rank // local_size`` is the node's index when every node runs as many workers (what unison's
torch launch assumes). `rank_variables` is what each worker then finds in its environment: torch's
``env://`` variables, which `init()` and ``init_process_group("unison")`` join through, and the
variables horovodrun gives a rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

__all__ = ["Place", "place", "rank_variables"]


@dataclasses.dataclass(frozen=True)
class Place:
    """One worker's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int  # Horovod's: this rank's index among the ranks of its local rank on every node
    cross_size: int
    node: str  # the node (or elastic host) it runs on
    node_rank: int  # the node's index, in order of first appearance


def place(nodes: Sequence[str]) -> tuple[Place, ...]:
    """Each worker's place, given the node each one runs on, in the order they were made.

    Returns one `Place` per worker, in the same order as `nodes`.

    Example:
        >>> [(p.rank, p.local_rank, p.cross_rank, p.cross_size) for p in place(["a", "b", "a", "b"])]
        [(0, 0, 0, 2), (2, 0, 1, 2), (1, 1, 0, 2), (3, 1, 1, 2)]
    """
    order: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        order.setdefault(node, []).append(index)
    ranks: dict[int, tuple[int, str, int, int, int]] = {}  # worker -> rank, node, node rank, local rank, local size
    rank = 0
    for node_rank, (node, workers) in enumerate(order.items()):
        for local_rank, worker in enumerate(workers):
            ranks[worker] = (rank, node, node_rank, local_rank, len(workers))
            rank += 1
    cross_sizes: dict[int, int] = {}
    for _, _, _, local_rank, _ in sorted(ranks.values()):
        cross_sizes[local_rank] = cross_sizes.get(local_rank, 0) + 1
    seen: dict[int, int] = {}
    cross_ranks: dict[int, int] = {}
    for rank_, _, _, local_rank, _ in sorted(ranks.values()):
        cross_ranks[rank_] = seen.get(local_rank, 0)
        seen[local_rank] = cross_ranks[rank_] + 1
    size = len(nodes)
    return tuple(Place(r, size, lr, ls, cross_ranks[r], cross_sizes[lr], node, nr)
                 for r, node, nr, lr, ls in (ranks[index] for index in range(size)))


def rank_variables(where: Place, master_addr: str, master_port: int, host: str,
                   extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker starts its part of the job with.

    torch's ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: rank 0's address and a port free there), then
    horovodrun's (``HOROVOD_RANK``, ``HOROVOD_HOSTNAME``, ...), then `extra` (the caller's, which win).

    Example:
        >>> env = rank_variables(place(["n1", "n1"])[1], "10.0.0.5", 29500, "n1")
        >>> env["RANK"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["HOROVOD_LOCAL_SIZE"]
        ('1', '1', '10.0.0.5', '2')
    """
    env = {
        "RANK": str(where.rank), "WORLD_SIZE": str(where.size),
        "LOCAL_RANK": str(where.local_rank), "LOCAL_WORLD_SIZE": str(where.local_size),
        "GROUP_RANK": str(where.node_rank), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(where.rank), "HOROVOD_SIZE": str(where.size),
        "HOROVOD_LOCAL_RANK": str(where.local_rank), "HOROVOD_LOCAL_SIZE": str(where.local_size),
        "HOROVOD_CROSS_RANK": str(where.cross_rank), "HOROVOD_CROSS_SIZE": str(where.cross_size),
    }
    env.update({name: str(value) for name, value in (extra or {}).items()})
    return env
