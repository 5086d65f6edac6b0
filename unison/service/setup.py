"""Starting the gRPC control plane at init(): secret, address, service on rank 0, clients everywhere."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._contract import write_service_file
from .._version import __version__
from ..config import Settings
from ..errors import AbortedError, ConfigError, MissingDependencyError, ShutdownError

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..backends.base import Backend
    from ..backends.grpc import GrpcBackend
    from ..engine.loop import Engine
    from .server import CoordinatorServer

__all__ = ["grpc_backend", "grpc_over", "start_service", "watch_engine"]

log = logging.getLogger(__name__)

_STUCK_GRACE_SECONDS = 5.0


def grpc_backend(comm: MPI.Intracomm, settings: Settings, local_size: int) -> GrpcBackend:
    """Build the backend for ``UNISON_CONTROLLER=grpc``: control over the service, data over MPI.

    Collective over `comm`: rank 0 starts the service and tells every rank its address (and, if no
    secret was configured, a fresh secret) over MPI.
    """
    _need_grpc()
    from ..backends.mpi import MpiBackend

    data = MpiBackend(comm, settings.chunk_bytes, settings.hierarchical_allreduce)
    host_ranks = data.split_host_group() if settings.service_host_aggregation else []
    return _on(data, lambda value: comm.bcast(value, root=0), settings, local_size,
               [] if len(host_ranks) == 1 else host_ranks)  # alone on its host: nothing to aggregate


def grpc_over(data: Backend, settings: Settings, local_size: int) -> GrpcBackend:
    """The same control plane over another data transport (gloo, in a job torchrun started): rank 0's
    address and a fresh secret travel over that transport's connections between the ranks (as over
    MPI's), never through torch's store, which any process that reaches it can read."""
    _need_grpc()

    def share(value: Any) -> Any:  # a JSON value
        payload = json.dumps(value).encode() if data.rank == 0 else None
        return json.loads(data.broadcast_bytes(payload).decode())

    return _on(data, share, settings, local_size, [])


def _need_grpc() -> None:
    try:
        from .server import CoordinatorServer  # noqa: F401 - fail here, with the hint, if grpc is missing
    except ImportError as exc:
        raise MissingDependencyError(
            "UNISON_CONTROLLER=grpc needs grpcio and protobuf: `pip install grpcio protobuf` "
            "(the `grpc` extra of unison: `pip install -e '.[grpc]'` in a checkout)."
        ) from exc


def _on(data: Backend, share: Callable[[Any], Any], settings: Settings, local_size: int,
        host_ranks: list[int]) -> GrpcBackend:
    """Rank 0's service, every rank's client, over `data`; `share` sends rank 0's value to every rank."""
    from ..backends.grpc import GrpcBackend
    from ..rpc.security import load_secret, new_secret
    from .client import ControlClient

    rank, size = data.rank, data.size
    secret = load_secret(settings)
    if secret is None:
        secret = share(new_secret() if rank == 0 else None)
    server = None
    outcome: list[str] = ["", ""]
    if rank == 0:
        try:
            server = start_service(settings, size, local_size, secret)
            outcome = ["ok", server.address]
            if settings.launcher_dir:
                write_service_file(settings.launcher_dir, server.address, secret)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the other ranks
            outcome = ["error", f"{type(exc).__name__}: {exc}"]
            failure = exc
    outcome = list(share(outcome))
    if outcome[0] != "ok":
        if rank == 0:
            raise failure
        raise ConfigError(f"rank 0 could not start the coordinator service: {outcome[1]}")
    address = outcome[1]
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        address = f"{share(os.uname().nodename if rank == 0 else None)}:{port}"
    control = ControlClient(address, secret, rank, speaks_for=host_ranks,
                            answer_timeout_seconds=settings.heartbeat_timeout_seconds)
    control.register(__version__, negotiate=not host_ranks or host_ranks[0] == rank)
    return GrpcBackend(control, data, size, server, host_ranks)


def start_service(settings: Settings, size: int, local_size: int, secret: str) -> CoordinatorServer:
    """Start rank 0's service on ``UNISON_SERVICE_ADDR`` (a free port of 127.0.0.1 on a single host) and
    log its address at INFO: ``coordinator service listening on 127.0.0.1:40123``."""
    from .server import CoordinatorServer

    address = settings.service_addr
    if not address:
        if local_size != size:
            raise ConfigError(
                "The ranks of this job span several hosts: set UNISON_SERVICE_ADDR=host:port to "
                "an address of rank 0's host that the other hosts can reach."
            )
        address = "127.0.0.1:0"
    server = CoordinatorServer(size, secret, address, __version__, settings.heartbeat_timeout_seconds)
    log.info("coordinator service listening on %s", server.address)
    return server


def watch_engine(backend: Any, engine: Engine) -> None:
    # Any: a Backend whose control plane is the service (GrpcBackend), which its caller checks by getattr
    """Feed heartbeats from the engine, tell the service why the engine failed if it does, and stop
    this process if an abort finds the engine stuck.

    An abort reaches a rank through its next exchange, which fails the pending collectives with
    `AbortedError`. A rank blocked inside an MPI data-plane call (waiting for a dead peer) never gets
    there; after a grace period it exits with status 1 so the launcher ends the job.
    """
    def progress() -> tuple[int, list[str]]:
        try:
            return engine.statistics().cycles, engine.pending_names()
        except RuntimeError:  # the engine thread changed the table mid-copy; report next second
            return engine.statistics().cycles, []

    def on_abort(reason: str) -> None:
        backend.interrupt(reason)  # a rank waiting for its host's peers stops waiting

        def exit_if_stuck() -> None:
            if engine.state != "stopped":
                print(f"unison: rank {backend.rank}: job aborted: {reason} This rank is stuck in a "
                      "data transfer with the lost rank; exiting.", file=sys.stderr, flush=True)
                os._exit(1)

        timer = threading.Timer(_STUCK_GRACE_SECONDS, exit_if_stuck)
        timer.daemon = True
        timer.start()

    def failure() -> str:
        # The engine stops with AbortedError when the job is aborted (every rank knows), with
        # ShutdownError on a normal end; anything else is its own failure, which the others must learn.
        error = engine.stop_error
        if error is None or isinstance(error, (AbortedError, ShutdownError)):
            return ""
        return str(error)

    backend.control.progress = progress
    backend.control.on_abort = on_abort
    backend.failure = failure
