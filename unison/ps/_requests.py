"""The checks of what a request to a parameter server carries: limits, keys, declarations, gradient pieces.

The checks here need nothing of a shard's state but a block's size or a table's width; `shard.Shard`
runs them and decides the rest. A malformed request raises `RequestError`, naming the field, the
bound and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import ConflictError, RequestError
from ._wire import MAX_KEY_CHARS, floats, ids_of, sum_rows
from .table import INITIALIZERS

__all__ = ["MAX_DIM", "MAX_ELEMENTS", "DenseDeclaration", "Piece", "TableDeclaration", "agree", "check_declarations", "dense_gradient", "sparse_gradient", "wanted_ids"]

MAX_DIM = 1 << 16  # widest table row
MAX_ELEMENTS = 1 << 34  # largest dense block, and most rows a table may declare


class Piece(Protocol):
    """A piece of a tensor in a request (a `ps_pb2.Piece`): a dense block's elements or a table's rows."""

    @property
    def key(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def ids(self) -> bytes: ...  # empty for a dense block
    @property
    def data(self) -> bytes: ...


class DenseDeclaration(Protocol):
    """A dense block as a trainer declares it (a `ps_pb2.DenseDecl`)."""

    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...


class TableDeclaration(Protocol):
    """A table as a trainer declares it (a `ps_pb2.TableDecl`): `capacity` is this server's share, `declared` the whole."""

    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def declared(self) -> int: ...
    @property
    def initializer(self) -> str: ...
    @property
    def scale(self) -> float: ...
    @property
    def seed(self) -> int: ...


def _check_key(key: str, *, dense: bool) -> None:
    what = "dense block" if dense else "table"
    if not key or len(key) > MAX_KEY_CHARS:
        raise RequestError(f"a {what} name must have 1 to {MAX_KEY_CHARS} characters. Got {len(key)}.")
    if ("#" in key) != dense:
        raise RequestError(f"a dense block key is '<parameter>#<block>' and a table name has no '#'. Got {what} "
                           f"{key!r}.")


def check_declarations(dense: Sequence[DenseDeclaration], tables: Sequence[TableDeclaration]) -> None:
    """Check the keys and bounds of declared blocks and tables (a block key has a '#', a table name none).

    Example:
        >>> from unison.ps import ps_pb2 as pb
        >>> check_declarations([pb.DenseDecl(key="w", size=3)], [])
        Traceback (most recent call last):
        ...
        unison.errors.RequestError: a dense block key is '<parameter>#<block>' and a table name has no '#'. Got dense block 'w'.
    """
    for decl in dense:
        _check_key(decl.key, dense=True)
        if not 0 < decl.size <= MAX_ELEMENTS:
            raise RequestError(f"dense block {decl.key!r}: size must be in [1, {MAX_ELEMENTS}]. Got {decl.size}.")
    for t in tables:
        _check_key(t.name, dense=False)
        if not 0 < t.dim <= MAX_DIM:
            raise RequestError(f"table {t.name!r}: dim must be in [1, {MAX_DIM}]. Got dim={t.dim}.")
        if not 0 < t.capacity <= MAX_ELEMENTS or not 0 <= t.declared <= MAX_ELEMENTS:
            raise RequestError(f"table {t.name!r}: capacity must be in [1, {MAX_ELEMENTS}]. Got capacity="
                               f"{t.declared or t.capacity} ({t.capacity} rows on this server).")
        if t.initializer not in INITIALIZERS:
            raise RequestError(f"table {t.name!r}: initializer must be one of {INITIALIZERS}. Got "
                               f"{t.initializer!r}.")


def agree(what: str, held: Mapping[str, Any], declared: Mapping[str, Any], trainer: int) -> None:
    """Refuse a declaration of `what` by `trainer` that differs from the one held, naming each difference.

    Raises:
        ConflictError: some field of `declared` differs from `held`.
    """
    differ = [f"{name}: {held[name]!r} here, {declared[name]!r} from trainer {trainer}"
              for name in held if held[name] != declared[name]]
    if differ:
        raise ConflictError(f"{what} was declared differently before; " + "; ".join(differ)
                            + ". Every trainer must declare the same parameters.")


def wanted_ids(pieces: Sequence[Piece]) -> dict[str, np.ndarray]:
    """The ids that `pieces` carry, by table, in their order (a pull's rows)."""
    chunks: dict[str, list[np.ndarray]] = {}
    for piece in pieces:
        chunks.setdefault(piece.key, []).append(ids_of(piece.ids, f"ids of table {piece.key!r}"))
    return {table: np.concatenate(c) if len(c) > 1 else c[0] for table, c in chunks.items()}


def dense_gradient(key: str, size: int, pieces: Sequence[Piece]) -> np.ndarray:
    """The gradient of block `key` of `size` elements, from pieces that cover it once, every value finite."""
    grad = np.zeros(size, np.float32)
    covered = 0
    for piece in pieces:
        data = floats(piece.data, f"gradient of {key!r}")
        if piece.offset + len(data) > size:
            raise RequestError(f"gradient of {key!r} at offset {piece.offset} runs past its {size} elements.")
        grad[piece.offset:piece.offset + len(data)] = data
        covered += len(data)
    if covered != size:
        raise RequestError(f"gradient of {key!r} carries {covered} elements; the block has {size}. Push whole "
                           "blocks.")
    if not np.isfinite(grad).all():
        raise RequestError(f"gradient of {key!r} holds NaN or infinity; nothing of this push was applied.")
    return grad


def sparse_gradient(name: str, dim: int, pieces: Sequence[Piece]) -> tuple[np.ndarray, np.ndarray]:
    """The unique ids and summed gradient rows of table `name` (rows of `dim`) that `pieces` carry, every value finite."""
    ids = np.concatenate([ids_of(p.ids, f"ids of table {name!r}") for p in pieces])
    data = np.concatenate([floats(p.data, f"gradient of table {name!r}") for p in pieces])
    if len(data) != len(ids) * dim:
        per_row = len(data) / max(len(ids), 1)
        raise RequestError(f"gradient of table {name!r} carries {per_row:g} values per row for {len(ids)} ids; the "
                           f"table's rows have dim={dim}.")
    if not np.isfinite(data).all():
        raise RequestError(f"gradient of table {name!r} holds NaN or infinity; nothing of this push was applied.")
    return sum_rows(ids, data.reshape(len(ids), dim))
