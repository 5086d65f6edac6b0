"""Which part a process plays in a parameter-server job, from keyword arguments or the settings.

The variables are rows of `unison.config.SETTINGS_TABLE` (read by `load_settings`, Paddle's names as
their aliases); only Paddle's ``POD_IP``/``PADDLE_PORT`` pair, which no one setting expresses, is
read here. The explicit form, for any launcher (``unisonrun --pservers N`` sets the same variables):

=================================  ===========================================  ===========================
variable                           meaning                                      Paddle's name (also read)
=================================  ===========================================  ===========================
``UNISON_PS_ROLE``                 ``server`` or ``trainer``                    ``PADDLE_TRAINING_ROLE``
``UNISON_PS_TRAINER_ID``           this trainer's id (else the MPI rank)        ``PADDLE_TRAINER_ID``
``UNISON_PS_SERVER_INDEX``         this server's index in the endpoints         (``POD_IP:PADDLE_PORT``)
``UNISON_PS_ENDPOINTS``            ``host:port,host:port``: every server        ``PADDLE_PSERVERS_IP_PORT_LIST``
``UNISON_PS_NUM_TRAINERS``         trainers of the job                          ``PADDLE_TRAINERS_NUM``
``UNISON_PS_MODE``                 ``async`` (default) or ``sync``
``UNISON_PS_CHECKPOINT_DIR``       servers keep and resume their shards here
``UNISON_PS_CHECKPOINT_SECONDS``   servers write a checkpoint this often (0)
``UNISON_PS_TRAINER_TIMEOUT_SECONDS``  a trainer silent this long is gone (10)
``UNISON_PS_RECONNECT_SECONDS``    a trainer waits this long for a lost server (60)
``UNISON_PS_ADDRESS_FILE``         a server writes its address here (and at its end, why, to ``.end``)
``UNISON_SECRET``/``_FILE``        the job secret, as for the coordinator service
=================================  ===========================================  ===========================

A server whose own entry in ``UNISON_PS_ENDPOINTS`` has port 0 listens on every interface on a free
port and writes it to ``UNISON_PS_ADDRESS_FILE`` (how ``unisonrun`` starts servers on several hosts).
When its work is over it writes the trainers it counted lost, with their hosts and pids, as JSON to
the same path with ``.end`` added (how ``unisonrun`` finds a lost trainer that still runs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..config import SETTINGS_TABLE, Settings, load_settings, process_environment
from ..errors import ConfigError
from ..rpc.security import load_secret
from .shard import MODES

__all__ = ["Role", "resolve_role"]

_FIELDS = {"role": "ps_role", "trainer_id": "ps_trainer_id", "server_index": "ps_server_index",
           "endpoints": "ps_endpoints", "num_trainers": "ps_num_trainers", "num_servers": "ps_num_servers",
           "mode": "ps_mode", "checkpoint_dir": "ps_checkpoint_dir", "checkpoint_seconds": "ps_checkpoint_seconds",
           "trainer_timeout_seconds": "ps_trainer_timeout_seconds", "address_file": "ps_address_file",
           "reconnect_seconds": "ps_reconnect_seconds"}
_UNSET: dict[str, Any] = {s.field: s.default for s in SETTINGS_TABLE if s.field in _FIELDS.values()}
_VARIABLES = {s.field: (s.env, s.alias) for s in SETTINGS_TABLE if s.field in _FIELDS.values()}
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


@dataclasses.dataclass(frozen=True)
class Role:
    """What this process is in a parameter-server job.

    Attributes:
        role: ``"server"`` or ``"trainer"``.
        index: the server's index or the trainer's id.
        endpoints: every server's ``host:port``, in server order (may be empty for a server that
            writes its address to `address_file`).
        num_servers: servers of the job.
        num_trainers: trainers of the job.
        mode: ``"async"`` or ``"sync"``.
        secret: the job secret.
        checkpoint_dir: where servers keep their shards ("" for nowhere).
        checkpoint_seconds: how often servers write them (0: on request and at the end only).
        trainer_timeout_seconds: a trainer silent this long is gone.
        address_file: a server writes its ``host:port`` here once it listens ("" for none).
        reconnect_seconds: a trainer waits this long for a server that stopped answering.
    """

    role: str
    index: int
    endpoints: tuple[str, ...]
    num_servers: int
    num_trainers: int
    mode: str = "async"
    secret: str = dataclasses.field(default="", repr=False)
    checkpoint_dir: str = ""
    checkpoint_seconds: float = 0.0
    trainer_timeout_seconds: float = 10.0
    address_file: str = ""
    reconnect_seconds: float = 60.0


def _get(environ: Mapping[str, str], settings: Settings, overrides: Mapping[str, Any],
         key: str) -> tuple[str, Any]:
    """(where the value came from, the value) or ("", None): a keyword, else the setting if it was set."""
    if overrides.get(key) is not None:
        return key, overrides[key]
    field = _FIELDS[key]
    value = getattr(settings, field)
    if value == _UNSET[field]:  # a setting at its default counts as unset, as an empty variable does
        return "", None
    env, alias = _VARIABLES[field]
    return (alias if alias and env not in environ else env), value


def _int(where: str, value: Any, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be an integer. Got {where}={value!r}.") from None
    if number < low:
        raise ConfigError(f"{where} must be at least {low}. Got {where}={number}.")
    return number


def _seconds(where: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number of seconds. Got {where}={value!r}.") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{where} must be a finite number of seconds >= 0. Got {where}={value!r}.")
    return number


def resolve_role(environ: Mapping[str, str], **overrides: Any) -> Role:
    """Decide this process's role from keyword overrides, then ``UNISON_PS_*`` (and Paddle's) variables.

    Args:
        environ: the environment (``os.environ``).
        **overrides: ``role``, ``trainer_id``, ``server_index``, ``endpoints`` (a list or a comma string),
            ``num_trainers``, ``mode``, ``checkpoint_dir``, ``checkpoint_seconds``,
            ``trainer_timeout_seconds``, ``reconnect_seconds``, ``secret``.

    Raises:
        ConfigError: a missing or bad value; the message names the variable or argument.

    Example:
        >>> env = {"UNISON_PS_ROLE": "trainer", "UNISON_PS_TRAINER_ID": "1", "UNISON_SECRET": "s" * 32,
        ...        "UNISON_PS_ENDPOINTS": "10.0.0.1:6000,10.0.0.2:6000", "UNISON_PS_NUM_TRAINERS": "4"}
        >>> resolve_role(env)
        Role(role='trainer', index=1, endpoints=('10.0.0.1:6000', '10.0.0.2:6000'), num_servers=2, num_trainers=4, mode='async', checkpoint_dir='', checkpoint_seconds=0.0, trainer_timeout_seconds=10.0, address_file='', reconnect_seconds=60.0)
    """
    settings = load_settings(environ)
    where, raw_role = _get(environ, settings, overrides, "role")
    if raw_role is None:
        raise ConfigError("No parameter-server role: set UNISON_PS_ROLE=server or trainer (or pass role=), or "
                          "start the job with `unisonrun -np N --pservers M python train.py`.")
    role = {"pserver": "server", "server": "server", "trainer": "trainer"}.get(str(raw_role).lower())
    if role is None:
        raise ConfigError(f"{where} must be 'server' or 'trainer'. Got {where}={raw_role!r}.")
    where, raw_endpoints = _get(environ, settings, overrides, "endpoints")
    if isinstance(raw_endpoints, str):
        raw_endpoints = [e.strip() for e in raw_endpoints.split(",") if e.strip()]
    endpoints = tuple(raw_endpoints or ())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"{where} lists servers as host:port. Got {endpoint!r} in {where}={raw_endpoints!r}.")
    where_n, raw_trainers = _get(environ, settings, overrides, "num_trainers")
    if raw_trainers is None:
        raise ConfigError("Set the number of trainers: UNISON_PS_NUM_TRAINERS=N (or num_trainers=).")
    num_trainers = _int(where_n, raw_trainers, 1)
    where_f, address_file = _get(environ, settings, overrides, "address_file")
    if role == "server":
        index = _server_index(environ, settings, overrides, endpoints)
        where_s, raw_servers = _get(environ, settings, overrides, "num_servers")
        num_servers = _int(where_s, raw_servers, 1) if raw_servers is not None else len(endpoints)
        if not endpoints and not address_file:
            raise ConfigError("A server needs UNISON_PS_ENDPOINTS (every server's host:port) or "
                              "UNISON_PS_ADDRESS_FILE (listen on any port and write the address there).")
        if not 0 <= index < max(num_servers, 1):
            raise ConfigError(f"UNISON_PS_SERVER_INDEX must be in range({num_servers}). Got {index}.")
        if endpoints and endpoints[index % len(endpoints)].endswith(":0") and not address_file:
            raise ConfigError(f"{where} gives this server port 0 (any free port), so the trainers could not know "
                              "it: set UNISON_PS_ADDRESS_FILE to learn the port, or give a port.")
    else:
        where_t, raw_id = _get(environ, settings, overrides, "trainer_id")
        if raw_id is None:
            ranks = process_environment(environ)
            where_t, raw_id = next(((v, ranks[v]) for v in _RANK_VARIABLES if ranks.get(v)), ("", None))
        if raw_id is None:
            raise ConfigError("Set this trainer's id: UNISON_PS_TRAINER_ID=K (or trainer_id=).")
        index = _int(where_t, raw_id, 0)
        if index >= num_trainers:
            raise ConfigError(f"{where_t} must be in range(num_trainers={num_trainers}). Got {index}.")
        if not endpoints:
            raise ConfigError("A trainer needs UNISON_PS_ENDPOINTS: every server's host:port, comma-separated.")
        if any(e.endswith(":0") for e in endpoints):
            raise ConfigError(f"A trainer needs every server's port; {where} has port 0 in {list(endpoints)}.")
        num_servers = len(endpoints)
    where_m, mode = _get(environ, settings, overrides, "mode")
    mode = mode or "async"
    if mode not in MODES:
        raise ConfigError(f"{where_m} must be one of {MODES}. Got {where_m}={mode!r}.")
    secret = overrides.get("secret") or load_secret(settings)
    if not secret:
        raise ConfigError("A parameter-server job needs its secret in UNISON_SECRET or UNISON_SECRET_FILE "
                          "(the same on every process; unisonrun --pservers makes one).")
    where_c, checkpoint_dir = _get(environ, settings, overrides, "checkpoint_dir")
    where_cs, raw_every = _get(environ, settings, overrides, "checkpoint_seconds")
    where_to, raw_timeout = _get(environ, settings, overrides, "trainer_timeout_seconds")
    timeout = _seconds(where_to, raw_timeout) if raw_timeout is not None else 10.0
    where_r, raw_reconnect = _get(environ, settings, overrides, "reconnect_seconds")
    return Role(role=role, index=index, endpoints=endpoints, num_servers=num_servers, num_trainers=num_trainers,
                mode=mode, secret=secret, checkpoint_dir=checkpoint_dir or "",
                checkpoint_seconds=_seconds(where_cs, raw_every) if raw_every is not None else 0.0,
                trainer_timeout_seconds=timeout, address_file=address_file or "",
                reconnect_seconds=_seconds(where_r, raw_reconnect) if raw_reconnect is not None else 60.0)


def _server_index(environ: Mapping[str, str], settings: Settings, overrides: Mapping[str, Any],
                  endpoints: tuple[str, ...]) -> int:
    where, raw = _get(environ, settings, overrides, "server_index")
    if raw is not None:
        return _int(where, raw, 0)
    ip, port = environ.get("POD_IP", ""), environ.get("PADDLE_PORT", "")
    if ip and port and f"{ip}:{port}" in endpoints:
        return endpoints.index(f"{ip}:{port}")
    raise ConfigError("Set this server's index: UNISON_PS_SERVER_INDEX=K (its place in UNISON_PS_ENDPOINTS).")
