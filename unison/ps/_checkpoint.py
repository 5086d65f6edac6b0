"""A server's shard on disk: one .npz file of plain arrays and a JSON header, replaced atomically, never pickled."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["checkpoint_path", "load", "save"]

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
