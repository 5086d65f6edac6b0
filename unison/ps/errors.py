"""The errors of parameter-server mode; they live in unison's one exception tree (`unison.errors`)."""

from __future__ import annotations

from ..errors import RequestError, ServerUnavailableError, TableFullError, TrainerLostError

__all__ = ["RequestError", "ServerUnavailableError", "TableFullError", "TrainerLostError"]
