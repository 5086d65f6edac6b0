"""The errors of parameter-server mode, in unison's tree (`unison.errors`).

    UnisonError
    ├── InvalidArgumentError (ValueError)
    │   └── RequestError                  a server refused a request: unknown table, wrong width, ...
    │       └── TableFullError            a table's shard has no room for a batch's new ids
    ├── ServerUnavailableError (RuntimeError)  a server did not answer within the reconnect time
    └── HorovodInternalError (RuntimeError)
        └── TrainerLostError              a synchronous step cannot complete: a trainer is gone
"""

from __future__ import annotations

from ..errors import HorovodInternalError, InvalidArgumentError, UnisonError

__all__ = ["RequestError", "ServerUnavailableError", "TableFullError", "TrainerLostError"]


class RequestError(InvalidArgumentError):
    """A parameter server refused a request; the message is the server's reason."""


class TableFullError(RequestError):
    """A batch brought more new ids than a table's shard has room for."""


class ServerUnavailableError(UnisonError, RuntimeError):
    """A parameter server did not answer (it is down, restarting too slowly, or unreachable)."""


class TrainerLostError(HorovodInternalError):
    """A synchronous step cannot complete because a trainer died, stopped or finished; the message names it."""
