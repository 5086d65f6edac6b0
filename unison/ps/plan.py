"""Where each parameter of a parameter-server job lives: pure placement of dense blocks and table rows.

Dense parameters are cut into blocks and each block is placed on one server. A parameter of more than
`slice_elements` elements (8192 by default, as Paddle's) is cut into up to one block per server, on
row boundaries, so one large matrix does not load one server; smaller parameters are one block.
Blocks are placed round robin in declaration order (the default), or by a stable hash of the
parameter's name (the same name lands on the same server whatever else is declared).

Rows of a sparse table are placed by a mixed hash of their id (`row_servers`), so ids with a common
stride (all even, all multiples of the number of servers) still spread evenly.

Example:
    >>> plan = plan_dense([("fc.weight", (256, 64)), ("fc.bias", (64,))], num_servers=2)
    >>> [(b.key, b.server, b.start, b.stop) for b in plan.blocks]
    [('fc.weight#0', 0, 0, 8192), ('fc.weight#1', 1, 8192, 16384), ('fc.bias#0', 0, 0, 64)]
"""

from __future__ import annotations

import dataclasses
import enum
import math
import zlib
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["DEFAULT_SLICE_ELEMENTS", "Block", "DensePlan", "Placement", "plan_dense", "row_servers",
           "split_rows"]

DEFAULT_SLICE_ELEMENTS = 8192


class Placement(enum.Enum):
    """How dense blocks are assigned to servers."""

    ROUND_ROBIN = "round_robin"
    NAME_HASH = "name_hash"


@dataclasses.dataclass(frozen=True)
class Block:
    """One contiguous run of a parameter's flattened elements, held by one server.

    Attributes:
        key: the block's name on the servers, ``<parameter>#<index>``.
        name: the parameter.
        index: the block's position within its parameter.
        server: the index of the server that holds it.
        start: first flattened element.
        stop: one past the last flattened element.
    """

    key: str
    name: str
    index: int
    server: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class DensePlan:
    """The blocks of every dense parameter, in declaration order.

    Attributes:
        num_servers: servers of the job.
        shapes: each parameter's shape, by name.
        blocks: every block, parameters in declaration order, each parameter's blocks in order.
    """

    num_servers: int
    shapes: dict[str, tuple[int, ...]]
    blocks: tuple[Block, ...]

    def of(self, name: str) -> tuple[Block, ...]:
        """The blocks of one parameter, in order."""
        return tuple(b for b in self.blocks if b.name == name)

    def on(self, server: int) -> tuple[Block, ...]:
        """The blocks that one server holds."""
        return tuple(b for b in self.blocks if b.server == server)

    def elements_per_server(self) -> list[int]:
        """How many elements each server holds (the load the placement balances)."""
        load = [0] * self.num_servers
        for b in self.blocks:
            load[b.server] += b.size
        return load


def _stable_hash(text: str) -> int:
    # crc32: the same on every process and Python version (the builtin hash() is salted per process)
    return zlib.crc32(text.encode("utf-8"))


def _cuts(shape: tuple[int, ...], num_servers: int, slice_elements: int) -> list[tuple[int, int]]:
    """Element ranges of one parameter's blocks: one block, or up to one per server on row boundaries."""
    total = math.prod(shape)
    if slice_elements <= 0 or total <= slice_elements or num_servers == 1 or not shape:
        return [(0, total)]
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    rows = shape[0]
    pieces = min(num_servers, math.ceil(total / slice_elements), rows)
    if pieces <= 1:
        return [(0, total)]
    base, extra = divmod(rows, pieces)
    cuts, first = [], 0
    for i in range(pieces):
        count = base + (1 if i < extra else 0)
        cuts.append((first * row, (first + count) * row))
        first += count
    return cuts


def plan_dense(params: Sequence[tuple[str, Sequence[int]]], num_servers: int, *,
               placement: Placement | str = Placement.ROUND_ROBIN,
               slice_elements: int = DEFAULT_SLICE_ELEMENTS) -> DensePlan:
    """Cut dense parameters into blocks and place each block on a server.

    Args:
        params: (name, shape) of each parameter, in a order every trainer shares.
        num_servers: servers of the job (at least 1).
        placement: ``"round_robin"`` (blocks dealt to servers in order) or ``"name_hash"``.
        slice_elements: parameters of more elements are cut across servers; 0 turns slicing off.

    Raises:
        InvalidArgumentError: no servers, a name given twice, a bad shape or placement.
    """
    if num_servers < 1:
        raise InvalidArgumentError(f"num_servers must be at least 1. Got num_servers={num_servers}.")
    try:
        how = Placement(placement)
    except ValueError:
        raise InvalidArgumentError(
            f"placement must be one of {[p.value for p in Placement]}. Got placement={placement!r}.") from None
    shapes: dict[str, tuple[int, ...]] = {}
    blocks: list[Block] = []
    turn = 0
    for name, raw_shape in params:
        if not name or "#" in name:
            raise InvalidArgumentError(f"A parameter name must be non-empty and without '#'. Got {name!r}.")
        if name in shapes:
            raise InvalidArgumentError(f"Parameter {name!r} is declared twice; each name must be unique.")
        shape = tuple(int(d) for d in raw_shape)
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"Parameter {name!r} has a negative dimension: shape={shape}.")
        shapes[name] = shape
        first = _stable_hash(name) % num_servers
        for index, (start, stop) in enumerate(_cuts(shape, num_servers, slice_elements)):
            if how is Placement.ROUND_ROBIN:
                server = turn % num_servers
                turn += 1
            else:
                server = (first + index) % num_servers
            blocks.append(Block(f"{name}#{index}", name, index, server, start, stop))
    return DensePlan(num_servers, shapes, tuple(blocks))


def _mix(ids: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over int64 ids, as uint64 (a cheap hash with good avalanche)."""
    z = ids.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def row_servers(ids: np.ndarray, num_servers: int) -> np.ndarray:
    """The server holding each row id of a sparse table (int64 ids, any value)."""
    return (_mix(np.asarray(ids, dtype=np.int64)) % np.uint64(num_servers)).astype(np.int64)


def split_rows(ids: np.ndarray, num_servers: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Deduplicate a batch's ids and group the unique ones by server.

    Returns:
        (unique ids sorted, inverse: each input id's index into the unique ids, per server the
        positions within the unique ids that it holds).

    Example:
        >>> unique, inverse, parts = split_rows(np.array([7, 3, 7, 9]), 1)
        >>> unique.tolist(), inverse.tolist(), [p.tolist() for p in parts]
        ([3, 7, 9], [1, 0, 1, 2], [[0, 1, 2]])
    """
    flat = np.asarray(ids, dtype=np.int64).reshape(-1)
    unique, inverse = np.unique(flat, return_inverse=True)
    servers = row_servers(unique, num_servers)
    parts = [np.flatnonzero(servers == s) for s in range(num_servers)]
    return unique, inverse.reshape(-1), parts
