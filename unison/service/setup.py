"""Starting the gRPC control plane at init(): secret, address, service on rank 0, clients everywhere."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from .._version import __version__
from ..config import Settings
from ..errors import ConfigError, MissingDependencyError

__all__ = ["grpc_backend", "watch_engine"]

log = logging.getLogger(__name__)

_STUCK_GRACE_SECONDS = 5.0


def grpc_backend(comm: Any, settings: Settings, local_size: int) -> Any:
    """Build the backend for ``UNISON_CONTROLLER=grpc``: control over the service, data over MPI.

    Collective over `comm`: rank 0 starts the service and tells every rank its address (and, if no
    secret was configured, a fresh secret) over MPI.
    """
    try:
        from .client import ControlClient, GrpcBackend
        from .security import load_secret, new_secret
        from .server import CoordinatorServer
    except ImportError as exc:
        raise MissingDependencyError(
            "UNISON_CONTROLLER=grpc needs grpcio and protobuf: `pip install 'unison[grpc]'`."
        ) from exc
    from ..backends.mpi import MpiBackend

    rank, size = comm.Get_rank(), comm.Get_size()
    secret = load_secret(settings)
    if secret is None:
        secret = comm.bcast(new_secret() if rank == 0 else None, root=0)
    server = None
    outcome: tuple[str, str] = ("", "")
    if rank == 0:
        try:
            address = settings.service_addr
            if not address:
                if local_size != size:
                    raise ConfigError(
                        "The ranks of this job span several hosts: set UNISON_SERVICE_ADDR=host:port to "
                        "an address of rank 0's host that the other hosts can reach."
                    )
                address = "127.0.0.1:0"
            server = CoordinatorServer(size, secret, address, __version__,
                                       settings.heartbeat_timeout_seconds)
            outcome = ("ok", server.address)
            log.info("coordinator service listening on %s", server.address)
            if settings.launcher_dir:
                from ..launcher._jobs import write_service_file

                write_service_file(settings.launcher_dir, server.address, secret)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the other ranks
            outcome = ("error", f"{type(exc).__name__}: {exc}")
            failure = exc
    outcome = comm.bcast(outcome, root=0)
    if outcome[0] != "ok":
        if rank == 0:
            raise failure
        raise ConfigError(f"rank 0 could not start the coordinator service: {outcome[1]}")
    address = outcome[1]
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        address = f"{comm.bcast(os.uname().nodename if rank == 0 else None, root=0)}:{port}"
    data = MpiBackend(comm, settings.chunk_bytes, settings.hierarchical_allreduce)
    host_ranks = data.split_host_group() if settings.service_host_aggregation else []
    if len(host_ranks) == 1:
        host_ranks = []  # alone on its host: nothing to aggregate
    control = ControlClient(address, secret, rank, speaks_for=host_ranks)
    control.register(__version__, negotiate=not host_ranks or host_ranks[0] == rank)
    return GrpcBackend(control, data, size, server, host_ranks)


def watch_engine(backend: Any, engine: Any) -> None:
    """Feed heartbeats from the engine, and stop this process if an abort finds the engine stuck.

    An abort reaches a rank through its next exchange, which fails the pending collectives with
    `AbortedError`. A rank blocked inside an MPI data-plane call (waiting for a dead peer) never gets
    there; after a grace period it exits with status 1 so the launcher ends the job.
    """
    def progress() -> tuple[int, list[str]]:
        try:
            return engine.statistics()["cycles"], list(engine._pending)
        except RuntimeError:  # the engine thread changed the table mid-copy; report next second
            return engine.statistics()["cycles"], []

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

    backend.control.progress = progress
    backend.control.on_abort = on_abort
