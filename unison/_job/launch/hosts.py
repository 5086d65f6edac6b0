"""The name a rank's host goes by in messages, whatever launched it."""

from __future__ import annotations

import socket

from ..._contract import ELASTIC_HOSTS_VARIABLE, host_of, parse_hosts
from ...config import Settings
from ...errors import ConfigError

__all__ = ["host_name"]


def host_name(settings: Settings, rank: int) -> str:
    """In an elastic launch the elastic host the rank runs as (the driver names hosts, and several may
    share one machine), else the machine's name."""
    if settings.elastic_driver and settings.elastic_hosts:
        try:
            hosts = parse_hosts(settings.elastic_hosts, ELASTIC_HOSTS_VARIABLE)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return host_of(hosts, rank) or socket.gethostname()
    return socket.gethostname()
