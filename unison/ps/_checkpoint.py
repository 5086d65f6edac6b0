"""A server's shard on disk: one .npz file of plain arrays and a JSON header, replaced atomically, never pickled."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .optim import Optimizer, from_fields
from .shard import DenseBlock, Shard
from .table import Initializer, TableShard

__all__ = ["checkpoint_path", "load", "restore_shard", "save", "shard_state"]

_FORMAT = 1


def checkpoint_path(directory: str, server: int, num_servers: int) -> Path:
    """Where server `server` of `num_servers` keeps its shard."""
    return Path(directory) / f"server-{server}-of-{num_servers}.npz"


def save(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Write the shard to a temporary file, flush it to disk, and rename it over `path`; return its bytes.

    A crash at any moment leaves either the previous checkpoint or the new one, never a mix.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    meta = np.frombuffer(json.dumps({"format": _FORMAT, **header}).encode("utf-8"), dtype=np.uint8)
    try:
        with open(tmp, "wb") as f:
            savez: Any = np.savez  # typed as if every keyword were its allow_pickle
            savez(f, __header__=meta, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power loss
    finally:
        os.close(fd)
    return path.stat().st_size


def _unreadable(source: object, what: str) -> ConfigError:
    return ConfigError(f"{source} is not a readable unison.ps checkpoint ({what}); move it away to start "
                       "from scratch.")


def load(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The header and arrays of a checkpoint, or None when there is none.

    Raises:
        ConfigError: the file is not a checkpoint of this format: not an .npz archive (or a truncated
            one), without a header, a header that is not a UTF-8 JSON object, another format number.
    """
    if not path.exists():
        return None
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded as npz:
                arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _unreadable(path, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise _unreadable(path, f"it holds one array of shape {loaded.shape}, not an .npz archive of arrays")
    raw = arrays.pop("__header__", None)
    if raw is None:
        raise _unreadable(path, "no __header__ array")
    try:
        header = json.loads(raw.tobytes().decode("utf-8"))
    except ValueError as exc:  # not UTF-8, or not JSON
        raise _unreadable(path, f"its __header__ is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise _unreadable(path, f"its __header__ is a JSON {type(header).__name__}, not an object")
    if header.get("format") != _FORMAT:
        raise ConfigError(f"{path} has checkpoint format {header.get('format')!r}; this unison reads {_FORMAT}.")
    return header, arrays


def _optimizer_fields(optimizer: Optimizer) -> dict[str, Any]:
    return {"kind": optimizer.kind, "fields": optimizer.fields()}


def shard_state(shard: Shard) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A checkpoint of `shard`: a JSON header and copies of its arrays, for `save`.

    It keeps the applied push numbers and no pending sums (a restored synchronous server resumes at
    the first step not applied), and leaves out blocks whose first values are not all there.
    """
    arrays: dict[str, np.ndarray] = {}
    dense = {}
    for key, block in shard.dense.items():
        if not block.ready:
            continue
        dense[key] = {"size": block.size, "optimizer": _optimizer_fields(block.optimizer)}
        arrays[f"dense/{key}/values"] = block.values.copy()
        arrays[f"dense/{key}/steps"] = block.steps.copy()
        arrays.update({f"dense/{key}/slot.{n}": a.copy() for n, a in block.slots.items()})
    tables = {}
    for name, table in shard.tables.items():
        tables[name] = {"dim": table.dim, "capacity": table.capacity, "declared_capacity": table.declared_capacity,
                        "initializer": dataclasses.asdict(table.initializer),
                        "optimizer": _optimizer_fields(table.optimizer)}
        arrays.update({f"table/{name}/{k}": a for k, a in table.state().items()})
    sequences = {str(t): n for t, n in sorted(shard.applied_sequences.items())}
    header = {"version": shard.version, "mode": shard.mode, "num_trainers": shard.num_trainers, "dense": dense,
              "tables": tables, "sequences": sequences}
    return header, arrays


def restore_shard(shard: Shard, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                  source: str = "the checkpoint") -> None:
    """Put the blocks, tables, version and push numbers of a `shard_state` into a new `shard`.

    Everything is read and checked before the shard changes: a checkpoint that does not restore
    leaves it as it was.

    Raises:
        ConfigError: `source` (where the state was read, for the message) was written in the other mode,
            or a field or an array is missing, of the wrong type or shape, or out of range.
    """
    if header.get("mode") != shard.mode:
        raise ConfigError(f"{source} was written in {header.get('mode')} mode; this server runs in {shard.mode}.")
    where = "its header"
    try:
        dense = {}
        for key, meta in _objects(header, "dense"):
            where = f"dense block {key!r}"
            optimizer = from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"])
            values = _array(arrays, f"dense/{key}/values", np.float32, (1, int(meta["size"])))
            slots = {n: _array(arrays, f"dense/{key}/slot.{n}", np.float32, values.shape)
                     for n in optimizer.slot_names}
            steps = _array(arrays, f"dense/{key}/steps", np.int64, (1,))
            dense[key] = DenseBlock(values, slots, steps, optimizer, filled=int(meta["size"]))
        tables = {}
        for name, meta in _objects(header, "tables"):
            where = f"table {name!r}"
            table = TableShard(name, int(meta["dim"]), int(meta["capacity"]), Initializer(**meta["initializer"]),
                               from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"]),
                               declared_capacity=int(meta.get("declared_capacity", 0)))
            prefix = f"table/{name}/"
            table.restore({k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)})
            tables[name] = table
        where = "its header"
        version = int(header["version"])
        applied = {int(t): int(n) for t, n in dict(header.get("sequences", {})).items()}
    except KeyError as exc:
        raise _unreadable(source, f"{where}: no {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise _unreadable(source, f"{where}: {exc}") from None
    shard.dense.update(dense)
    shard.tables.update(tables)
    shard.version = version
    shard.applied_sequences = applied
    shard.sequences = dict(applied)
    shard.restored = True


def _objects(header: Mapping[str, Any], field: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The entries of `header[field]`, a JSON object of JSON objects."""
    entries = header[field]
    if not isinstance(entries, dict) or not all(isinstance(meta, dict) for meta in entries.values()):
        raise TypeError(f"{field!r} must be an object of objects. Got {json.dumps(entries)[:200]}")
    return list(entries.items())


def _array(arrays: Mapping[str, np.ndarray], name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Array `name`, checked to be of `dtype` and `shape`."""
    array = arrays[name]
    if array.dtype != dtype or array.shape != shape:
        raise ValueError(f"array {name!r} is {array.dtype}{list(array.shape)}; expected "
                         f"{np.dtype(dtype)}{list(shape)}")
    return array
