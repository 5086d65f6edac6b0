"""The module-level API of parameter-server mode: `init` plays this process's role; the rest go to its client."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NotInitializedError
from .client import Client
from .optim import Optimizer
from .plan import DensePlan
from .roles import Role, resolve_role
from .server import LOST_EXIT_STATUS, ParameterServer
from .table import Initializer

__all__ = ["checkpoint", "client", "declare_dense", "declare_table", "init", "num_trainers", "pull",
           "pull_dense", "pull_sparse", "push", "role", "run_server", "server_statistics", "shutdown",
           "statistics", "trainer_id"]

log = logging.getLogger(__name__)

_client: Client | None = None
_role: Role | None = None


def _write_atomically(path: str, text: str) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run_server(role: Role) -> int:
    """Serve one shard until its work is over, write the last checkpoint and stop; return the exit status.

    The work is over when every trainer finished (status 0), or when the trainers that did not are
    lost, after the others finished (asynchronous mode) or were told that a step failed
    (synchronous mode): status `LOST_EXIT_STATUS` (3). See `_steps.server_end`.
    """
    listen = role.endpoints[role.index] if role.endpoints else "127.0.0.1:0"
    if role.endpoints:
        listen = "[::]:" + listen.rpartition(":")[2] if not listen.startswith("127.") else listen
    server = ParameterServer(role.index, role.num_servers, role.num_trainers, role.secret, mode=role.mode,
                             address=listen, checkpoint_dir=role.checkpoint_dir,
                             checkpoint_seconds=role.checkpoint_seconds,
                             trainer_timeout_seconds=role.trainer_timeout_seconds)
    address = server.start()
    if role.address_file:
        _write_atomically(role.address_file, address)
    try:
        server.wait_finished()
        if role.address_file:  # the launcher reads who was lost here (unisonrun names and stops them)
            _write_atomically(role.address_file + ".end", json.dumps(server.end_record()))
    finally:
        server.stop()
    if server.every_trainer_finished:
        log.info("parameter server %d: every trainer finished", role.index)
        return 0
    log.warning("parameter server %d (%s) ends: %s", role.index, address, server.end_reason)
    return LOST_EXIT_STATUS


def init(**overrides: Any) -> Client:
    """Play this process's part: a server serves until its trainers are done and exits; a trainer connects.

    The role comes from keyword arguments (``role``, ``trainer_id``, ``server_index``, ``endpoints``,
    ``num_trainers``, ``mode``, ``checkpoint_dir``, ...) or ``UNISON_PS_*`` variables (see
    `unison.ps.roles`); ``unisonrun -np 4 --pservers 2 python train.py`` sets them. A server never
    returns from `init`, so the script's training code runs on trainers only.

    Example:
        >>> import unison.ps as ps                                                # doctest: +SKIP
        >>> ps.init()                      # servers stop here                   # doctest: +SKIP
        >>> ps.declare_table("emb", dim=16, capacity=1_000_000)                   # doctest: +SKIP
        >>> rows = ps.pull_sparse("emb", ids)                                     # doctest: +SKIP
        >>> ps.push(sparse={"emb": (ids, grads)})                                 # doctest: +SKIP
        >>> ps.shutdown()                                                         # doctest: +SKIP
    """
    global _client, _role
    role_ = resolve_role(os.environ, **overrides)
    if role_.role == "server":
        sys.exit(run_server(role_))
    connection = Client(role_.endpoints, role_.secret, trainer=role_.index, num_trainers=role_.num_trainers,
                        mode=role_.mode, reconnect_seconds=role_.reconnect_seconds)
    connection.connect()
    _client, _role = connection, role_
    return connection


def client() -> Client:
    """This trainer's client (after `init`)."""
    if _client is None:
        raise NotInitializedError("unison.ps is not initialized on this process; call unison.ps.init() first.")
    return _client


def role() -> str:
    """``"trainer"`` after `init` (a server never returns from it)."""
    client()
    return "trainer"


def trainer_id() -> int:
    """This trainer's id."""
    return client().trainer


def num_trainers() -> int:
    """Trainers of the job."""
    return client().num_trainers


def declare_dense(params: Mapping[str, np.ndarray], optimizer: Optimizer | None = None) -> DensePlan:
    """Place dense parameters on the servers (trainer 0's values start them); see `Client.declare_dense`."""
    return client().declare_dense(params, optimizer)


def declare_table(name: str, dim: int, capacity: int, *, initializer: Initializer | None = None,
                  optimizer: Optimizer | None = None) -> None:
    """Create a sparse table held by the servers; see `Client.declare_table`."""
    client().declare_table(name, dim, capacity, initializer=initializer, optimizer=optimizer)


def pull(dense: Sequence[str] = (), sparse: Mapping[str, np.ndarray] | None = None,
         ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Dense values and table rows in one call per server; see `Client.pull`."""
    return client().pull(dense, sparse)


def pull_dense(names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The current values of dense parameters."""
    return client().pull_dense(names)


def pull_sparse(table: str, ids: np.ndarray) -> np.ndarray:
    """The rows of `ids`, shape ``ids.shape + (dim,)``; only unique ids travel."""
    return client().pull_sparse(table, ids)


def push(dense: Mapping[str, np.ndarray] | None = None,
         sparse: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
    """Send one step's gradients; see `Client.push`."""
    client().push(dense, sparse)


def statistics() -> dict[str, float]:
    """This trainer's counters: calls, bytes sent and received, rows, seconds."""
    return client().statistics()


def server_statistics() -> list[dict[str, Any]]:
    """Every server's statistics (staleness, memory, trainers), in server order."""
    return client().server_statistics()


def checkpoint() -> list[str]:
    """Ask every server to write its checkpoint now."""
    return client().checkpoint()


def shutdown() -> None:
    """Tell the servers this trainer is done and close its connections."""
    global _client
    if _client is not None:
        _client.finish()
        _client = None
