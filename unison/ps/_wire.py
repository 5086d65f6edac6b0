"""Tensors on the parameter-server wire: cutting them into frames of bounded size, and reading them back checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from . import ps_pb2 as pb

__all__ = ["DEFAULT_CHUNK_BYTES", "MAX_KEY_CHARS", "Part", "floats", "frames", "ids_of", "sum_rows"]

DEFAULT_CHUNK_BYTES = 1024 * 1024
MAX_KEY_CHARS = 256


@dataclasses.dataclass(frozen=True)
class Part:
    """One tensor to send: a dense block's values (`ids` None) or a table's rows for `ids`."""

    key: str
    data: np.ndarray  # float32; dense: 1-D; sparse: (len(ids), dim)
    ids: np.ndarray | None = None


def _pieces(part: Part, chunk_bytes: int) -> Iterator[pb.Piece]:
    if part.ids is None:
        flat = np.ascontiguousarray(part.data, dtype="<f4").reshape(-1)
        step = max(1, chunk_bytes // 4)
        for start in range(0, max(len(flat), 1), step):
            yield pb.Piece(key=part.key, offset=start, data=flat[start:start + step].tobytes())
        return
    ids = np.ascontiguousarray(part.ids, dtype="<i8").reshape(-1)
    rows = np.ascontiguousarray(part.data, dtype="<f4").reshape(len(ids), -1)
    per_row = 8 + rows.shape[1] * 4
    step = max(1, chunk_bytes // per_row)
    for start in range(0, len(ids), step):
        yield pb.Piece(key=part.key, offset=start, ids=ids[start:start + step].tobytes(),
                       data=rows[start:start + step].tobytes())


def frames(header: pb.Frame, parts: Sequence[Part], chunk_bytes: int) -> Iterator[pb.Frame]:
    """`header` followed by `parts`, as frames of about `chunk_bytes` of tensor data each.

    The first frame is a copy of `header` (with the first pieces); every later frame repeats only its
    trainer and step. A call with no parts sends just the header. `header` itself is left as it is,
    so a call sent again carries the same frames.
    """
    frame, size = pb.Frame(), 0
    frame.CopyFrom(header)
    for part in parts:
        for piece in _pieces(part, chunk_bytes):
            if size and size + len(piece.data) + len(piece.ids) > chunk_bytes:
                yield frame
                frame, size = pb.Frame(trainer=header.trainer, step=header.step, based_on=header.based_on), 0
            frame.pieces.append(piece)
            size += len(piece.data) + len(piece.ids)
    yield frame


def floats(data: bytes, what: str) -> np.ndarray:
    """Little-endian float32 values from bytes (read-only view)."""
    if len(data) % 4:
        raise InvalidArgumentError(f"{what}: {len(data)} bytes of float32 data is not a multiple of 4.")
    return np.frombuffer(data, dtype="<f4")


def ids_of(data: bytes, what: str) -> np.ndarray:
    """Little-endian int64 ids from bytes (read-only view)."""
    if len(data) % 8:
        raise InvalidArgumentError(f"{what}: {len(data)} bytes of int64 ids is not a multiple of 8.")
    return np.frombuffer(data, dtype="<i8")


def sum_rows(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique ids and the sum of the rows given for each (repeated ids add up)."""
    unique, inverse = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        order = np.argsort(ids, kind="stable")
        return ids[order], rows[order]
    total = np.zeros((len(unique), rows.shape[1]), np.float32)
    np.add.at(total, inverse.reshape(-1), rows)
    return unique, total
