"""A server's shard on disk: one .npz file of plain arrays and a JSON header, replaced atomically, never pickled."""

from __future__ import annotations

import dataclasses
import json
import os
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


def load(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The header and arrays of a checkpoint, or None when there is none.

    Raises:
        ConfigError: the file is not a checkpoint of this format.
    """
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        header = json.loads(arrays.pop("__header__").tobytes().decode("utf-8"))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path} is not a readable unison.ps checkpoint ({exc}); move it away to start "
                          "from scratch.") from None
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

    Raises:
        ConfigError: `source` (where the state was read, for the message) was written in the other mode.
    """
    if header.get("mode") != shard.mode:
        raise ConfigError(f"{source} was written in {header.get('mode')} mode; this server runs in {shard.mode}.")
    for key, meta in header["dense"].items():
        optimizer = from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"])
        slots = {n: arrays[f"dense/{key}/slot.{n}"] for n in optimizer.slot_names}
        shard.dense[key] = DenseBlock(arrays[f"dense/{key}/values"], slots, arrays[f"dense/{key}/steps"],
                                      optimizer, filled=int(meta["size"]))
    for name, meta in header["tables"].items():
        table = TableShard(name, int(meta["dim"]), int(meta["capacity"]), Initializer(**meta["initializer"]),
                           from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"]),
                           declared_capacity=int(meta.get("declared_capacity", 0)))
        prefix = f"table/{name}/"
        table.restore({k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)})
        shard.tables[name] = table
    shard.version = int(header["version"])
    shard.applied_sequences = {int(t): int(n) for t, n in header.get("sequences", {}).items()}
    shard.sequences = dict(shard.applied_sequences)
    shard.restored = True
