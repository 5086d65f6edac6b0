"""When a parameter server reads its checkpoint (at start) or writes it (on request, or every few seconds after a change).

The files are `_checkpoint`'s; this module decides when to write, takes the shard's state under the
server's lock, writes it outside the lock (one write at a time), and counts what it wrote.
"""

from __future__ import annotations

import logging
import threading

from ..errors import ConfigError
from . import _checkpoint
from .shard import Shard

__all__ = ["Checkpointer"]

log = logging.getLogger(__name__)


class Checkpointer:
    """Keep one server's shard on disk.

    Args:
        shard: the shard.
        lock: the server's lock, held around every use of the shard.
        directory: where the checkpoint lives ("" for none: `write` is refused).
        server: the server's index.
        num_servers: servers of the job (the file's name holds both).
        seconds: write this often when the shard's version moved (0: only on request).
    """

    def __init__(self, shard: Shard, lock: threading.Lock, directory: str, server: int,
                 num_servers: int, seconds: float = 0.0) -> None:
        self.shard, self.directory, self.server, self.num_servers = shard, directory, server, num_servers
        self.seconds = seconds
        self.version = -1  # of the checkpoint last written or resumed from
        self.counts = {"checkpoints": 0, "checkpoint_bytes": 0}  # changed under `lock`
        self._lock = lock
        self._writing = threading.Lock()

    def __repr__(self) -> str:
        return (f"<Checkpointer of server {self.server} in {self.directory or '-'}: version {self.version}, "
                f"{self.counts['checkpoints']} written>")

    def restore(self) -> None:
        """Resume the (new) shard from the checkpoint, when the directory holds one."""
        if not self.directory:
            return
        path = _checkpoint.checkpoint_path(self.directory, self.server, self.num_servers)
        found = _checkpoint.load(path)
        if found is None:
            return
        header, arrays = found
        _checkpoint.restore_shard(self.shard, header, arrays, source=str(path))
        self.version = self.shard.version
        log.info("parameter server %d resumed from %s at version %d", self.server, path, self.shard.version)

    def write(self) -> str:
        """Write the shard to the checkpoint directory atomically; return the file's path."""
        if not self.directory:
            raise ConfigError("this parameter server has no checkpoint directory (UNISON_PS_CHECKPOINT_DIR).")
        with self._writing:
            with self._lock:
                header, arrays = _checkpoint.shard_state(self.shard)
            version = int(header["version"])
            path = _checkpoint.checkpoint_path(self.directory, self.server, self.num_servers)
            size = _checkpoint.save(path, header, arrays)
            self.version = version
            with self._lock:
                self.counts["checkpoints"] += 1
                self.counts["checkpoint_bytes"] = size
            log.info("parameter server %d wrote its checkpoint at version %d (%d bytes)", self.server, version, size)
            return str(path)

    def start(self, stopping: threading.Event) -> None:
        """Write every `seconds` when the shard changed, until `stopping` is set (with a directory and `seconds`)."""
        if self.directory and self.seconds > 0:
            threading.Thread(target=self._tick, args=(stopping,), name="unison-ps-checkpoint", daemon=True).start()

    def _tick(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.seconds):
            if self.shard.version != self.version:
                try:
                    self.write()
                except OSError as exc:
                    log.error("parameter server %d could not write its checkpoint: %s", self.server, exc)
