"""The job secret of a gRPC service of unison: where it comes from, and how calls prove they know it;
and the TLS material that encrypts the channels, where the job gives one.

Every call carries the secret in its metadata under `TOKEN_KEY` (`token_metadata`); the server's
`gate.Gate` compares it in constant time (`token_matches`) before the call holds anything. Channels
are plain text unless ``UNISON_TLS_CERT_FILE`` (or ``UNISON_TLS_CA_FILE``) is set (`tls_of`): then the
secret and every message travel encrypted, and clients check the service's certificate.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import secrets
import stat

from ..config import Settings, load_settings
from ..errors import ConfigError

__all__ = ["MIN_SECRET_LENGTH", "TOKEN_KEY", "Tls", "load_secret", "new_secret", "tls_here", "tls_of",
           "token_matches", "token_metadata"]

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
        secret = _read("UNISON_SECRET_FILE", settings.secret_file, private=True).decode("utf-8").strip()
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


def _read(variable: str, path: str, *, private: bool = False) -> bytes:
    """The bytes of the file a setting names; a private one must not be accessible to group or others
    (checked on the file opened, so it cannot be swapped between the check and the read).

    Raises:
        ConfigError: the file cannot be read, or a private one is open to group or others.
    """
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(
                    f"{variable}={path!r} is accessible to group or others (mode {stat.S_IMODE(mode):04o}); "
                    f"make it private with `chmod 600 {path}`."
                )
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{variable}={path!r} cannot be read: {exc.strerror}.") from None


def _read_pem(variable: str, path: str, *, private: bool = False) -> bytes:
    """A PEM file a TLS setting names (certificates or a key), refused when it holds none."""
    data = _read(variable, path, private=private)
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{variable}={path!r} holds no PEM block (-----BEGIN ...): give a PEM "
                          f"{'private key' if private else 'certificate'} file.")
    return data


@dataclasses.dataclass(frozen=True)
class Tls:
    """The TLS material of a job's gRPC channels (`tls_of`)."""

    authority: bytes  # PEM certificates a client checks a service's certificate against
    certificate: bytes  # PEM chain a service presents (b"" where only clients run)
    key_file: str = ""  # its private key's file, read where a service runs (`server_credentials`)
    server_name: str = ""  # the name clients expect in the certificate ("": the host they connect to)

    def server_credentials(self, who: str) -> tuple[bytes, bytes]:
        """The (key, certificate chain) a service listens with; the key is read here, so a process
        that only connects needs no key file.

        Raises:
            ConfigError: this process has no certificate or no key to serve with, or the key file
                cannot be read, holds no PEM block, or is open to group or others.
        """
        if not self.certificate or not self.key_file:
            missing = "UNISON_TLS_CERT_FILE" if not self.certificate else "UNISON_TLS_KEY_FILE"
            raise ConfigError(
                f"{who} serves over TLS (UNISON_TLS_* is set) but {missing} is not set here: a service needs "
                "both its certificate and its private key.")
        return _read_pem("UNISON_TLS_KEY_FILE", self.key_file, private=True), self.certificate


def tls_of(settings: Settings) -> Tls | None:
    """The TLS material the settings name (certificates read, the key's file kept for a service);
    None where channels are plain text.

    Raises:
        ConfigError: a file cannot be read or holds no PEM block, or a key or server name is given
            without a certificate to go with it.
    """
    if not (settings.tls_cert_file or settings.tls_ca_file):
        for variable, value in (("UNISON_TLS_KEY_FILE", settings.tls_key_file),
                                ("UNISON_TLS_SERVER_NAME", settings.tls_server_name)):
            if value:
                raise ConfigError(f"{variable} is set without UNISON_TLS_CERT_FILE or UNISON_TLS_CA_FILE: "
                                  "TLS needs a certificate (channels would otherwise stay plain text).")
        return None
    certificate = _read_pem("UNISON_TLS_CERT_FILE", settings.tls_cert_file) if settings.tls_cert_file else b""
    authority = _read_pem("UNISON_TLS_CA_FILE", settings.tls_ca_file) if settings.tls_ca_file else certificate
    return Tls(authority, certificate, settings.tls_key_file, settings.tls_server_name)


def tls_here() -> Tls | None:
    """`tls_of` this process's ``UNISON_TLS_*`` variables alone: a channel or a service never fails on
    another setting's bad value (the job's start checks those)."""
    return tls_of(load_settings({k: v for k, v in os.environ.items() if k.startswith("UNISON_TLS_")}))
