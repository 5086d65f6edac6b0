"""What a `RayExecutor` job is set up with: Horovod's ``MiniSettings``, made by ``RayExecutor.create_settings``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["MiniSettings", "check_seconds"]


@dataclasses.dataclass
class MiniSettings:
    """The settings of a Ray job (Horovod's fields; mutable, as Horovod's, so that a test can set `discovery`).

    `timeout_s` bounds how long the workers wait for each other when they join the job (unison's
    start timeout, ``UNISON_START_TIMEOUT_SECONDS`` in each worker); `placement_group_timeout_s` how
    long the executor waits for Ray to reserve the workers' resources. `nics` names the network
    interfaces the workers' gloo transport may use (``GLOO_SOCKET_IFNAME``). `discovery` is an elastic
    job's host discovery: any object with ``find_available_hosts_and_slots() -> {host: slots}``.
    The ssh fields are Horovod's and unused: the workers are Ray actors, started without ssh.
    """

    nics: set[str] | None = None
    verbose: int = 1
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    timeout_s: float = 300
    placement_group_timeout_s: float = 100
    elastic: bool = False
    discovery: Any = None
    discovery_interval_s: float = 1.0


def check_seconds(name: str, value: object) -> float:
    """`value` as a positive, finite number of seconds, or an error naming `name`.

    Example:
        >>> check_seconds("timeout_s", 30)
        30.0
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a positive number of seconds. Got {name}={value!r}.")
    return seconds
