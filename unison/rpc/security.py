"""The job secret of a gRPC service of unison: where it comes from, and how calls prove they know it.

Every call carries the secret in its metadata under `TOKEN_KEY` (`token_metadata`); the server's
`gate.Gate` compares it in constant time (`token_matches`) before the call holds anything.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat

from ..config import Settings
from ..errors import ConfigError

__all__ = ["MIN_SECRET_LENGTH", "TOKEN_KEY", "load_secret", "new_secret", "token_matches", "token_metadata"]

MIN_SECRET_LENGTH = 32
TOKEN_KEY = "x-unison-token"  # gRPC metadata key carrying the secret on every call


def new_secret() -> str:
    """A fresh random secret (32 random bytes, hex)."""
    return secrets.token_hex(32)


def load_secret(settings: Settings) -> str | None:
    """The secret from ``UNISON_SECRET`` or ``UNISON_SECRET_FILE``, or None if neither is set.

    Raises:
        ConfigError: the secret is too short, or its file is missing or readable by group or others.
    """
    if settings.secret:
        secret = settings.secret.strip()
        source = "UNISON_SECRET"
    elif settings.secret_file:
        path = settings.secret_file
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise ConfigError(f"UNISON_SECRET_FILE={path!r} cannot be read: {exc.strerror}.") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"UNISON_SECRET_FILE={path!r} is accessible to group or others (mode "
                f"{stat.S_IMODE(mode):04o}); make it private with `chmod 600 {path}`."
            )
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
        source = "UNISON_SECRET_FILE"
    else:
        return None
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"The secret from {source} must be at least {MIN_SECRET_LENGTH} characters; it has "
            f"{len(secret)}. Make one with `python -c 'import secrets; print(secrets.token_hex(32))'`."
        )
    return secret


def token_matches(presented: str | bytes | None, secret: str) -> bool:
    """Constant-time check of a presented token against the secret."""
    if presented is None:
        return False
    if isinstance(presented, str):
        presented = presented.encode()
    return hmac.compare_digest(presented, secret.encode())


def token_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that proves a caller knows `secret`.

    Example:
        >>> token_metadata("s" * 32)[0][0]
        'x-unison-token'
    """
    return ((TOKEN_KEY, secret),)
