"""Parameter-server mode: dense parameters and sparse tables held by servers, trained by pulling and pushing.

Example:
    >>> import unison.ps as ps                                                     # doctest: +SKIP
    >>> ps.init()                         # a server process serves here and exits  # doctest: +SKIP
    >>> ps.declare_dense({"w": w}, ps.Adam(0.01))                                  # doctest: +SKIP
    >>> ps.declare_table("emb", dim=16, capacity=1_000_000)                        # doctest: +SKIP
    >>> values, rows = ps.pull(["w"], {"emb": ids})                                # doctest: +SKIP
    >>> ps.push(dense={"w": grad_w}, sparse={"emb": (ids, grad_rows)})             # doctest: +SKIP
    >>> ps.shutdown()                                                              # doctest: +SKIP

PyTorch: `unison.ps.torch`; Keras 3: `unison.ps.keras`; the design: docs/ps.md.
"""

from ._api import (
    checkpoint,
    client,
    declare_dense,
    declare_table,
    init,
    num_trainers,
    pull,
    pull_dense,
    pull_sparse,
    push,
    role,
    server_statistics,
    shutdown,
    statistics,
    trainer_id,
)
from .client import Client
from .errors import RequestError, ServerUnavailableError, TableFullError, TrainerLostError
from .optim import SGD, Adagrad, Adam, Momentum, Optimizer
from .plan import Placement
from .roles import Role, resolve_role
from .server import ParameterServer
from .table import Initializer

__all__ = [
    "Adagrad",
    "Adam",
    "Client",
    "Initializer",
    "Momentum",
    "Optimizer",
    "ParameterServer",
    "Placement",
    "RequestError",
    "Role",
    "SGD",
    "ServerUnavailableError",
    "TableFullError",
    "TrainerLostError",
    "checkpoint",
    "client",
    "declare_dense",
    "declare_table",
    "init",
    "num_trainers",
    "pull",
    "pull_dense",
    "pull_sparse",
    "push",
    "resolve_role",
    "role",
    "server_statistics",
    "shutdown",
    "statistics",
    "trainer_id",
]
