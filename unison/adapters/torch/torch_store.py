"""A torch store for a unison job: the one the ranks met at, or one rank 0 hosts for a job over MPI,
and the env:// rendezvous that hands it to ``init_process_group`` when ``MASTER_ADDR`` is unset."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from ..._job import runtime as _runtime
from ...errors import InvalidArgumentError

__all__ = ["job_store", "rendezvous_with_fallback"]


def job_store(timeout: timedelta) -> tuple[dist.Store, int, int]:
    """A torch store shared by the ranks of the unison job, with this rank and the job's size.

    Rank 0 hosts a TCPStore on a free port and the others learn its address through unison (a
    broadcast): no MASTER_ADDR or MASTER_PORT is needed. One process gets an in-memory store. When every
    rank is on rank 0's host, the store listens on the loopback interface only (torch's own server
    listens on every interface): nothing off the host can reach it.
    """
    if not _runtime.is_initialized():
        _runtime.init()
    rank, size = _runtime.rank(), _runtime.size()
    if size == 1:
        return dist.HashStore(), rank, size
    from ..._job.objects import broadcast_object

    address = None
    if rank == 0:
        if _runtime.local_size() == size:
            store, port = _loopback_store(size, timeout)
            address = ("127.0.0.1", port)
        else:
            host = socket.getfqdn()
            store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
            address = (host, store.port)
    address = broadcast_object(address, root_rank=0, name="torch.store.address")
    if rank != 0:
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=timeout)
    return store, rank, size


def _loopback_store(size: int, timeout: timedelta) -> tuple[dist.TCPStore, int]:
    """A master TCPStore that listens on 127.0.0.1 alone, on a free port: torch binds its own server to
    every interface, so the listening socket is made here and a duplicate of it handed over (torch owns
    and closes that one; a failure never closes a descriptor twice). Before torch 2.8, libuv's server
    did not listen on a socket it was given (torch PR 150215): there the classic server takes it. A
    torch without ``master_listen_fd`` gets its own server, on every interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(max(size, 128))
        port = listener.getsockname()[1]
        handed = os.dup(listener.fileno())
        try:
            if torch.__version__ < "2.8":  # a TorchVersion: compared as a version, not as text
                store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=timeout,
                                      wait_for_workers=False, master_listen_fd=handed, use_libuv=False)
            else:
                store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=timeout,
                                      wait_for_workers=False, master_listen_fd=handed)
        except TypeError:  # no master_listen_fd or use_libuv in this torch: the descriptor was never taken
            os.close(handed)
            store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
            return store, store.port
    return store, port


def rendezvous_with_fallback(original: Callable[..., Iterator[tuple[dist.Store, int, int]]],
                              ) -> Callable[..., Iterator[tuple[dist.Store, int, int]]]:
    """torch's env:// rendezvous, unless MASTER_ADDR is unset: then the unison job's own (`job_store`).

    torch reads its launch variables from the environment itself; so does this check, for the same ones.
    """
    def handler(url: str, timeout: timedelta = timedelta(minutes=30),
                **kwargs: object) -> Iterator[tuple[dist.Store, int, int]]:
        if os.environ.get("MASTER_ADDR"):
            yield from original(url, timeout, **kwargs)
            return
        store, rank, size = job_store(timeout)
        asked = dict(part.split("=", 1) for part in url.partition("?")[2].split("&") if "=" in part)
        if int(asked.get("rank", rank)) != rank or int(asked.get("world_size", size)) != size:
            raise InvalidArgumentError(
                f"init_process_group was given rank={asked.get('rank')}, world_size={asked.get('world_size')}, "
                f"but the unison job has rank {rank} of {size}. Leave rank and world_size out under unisonrun "
                "or mpiexec: they come from the job.")
        yield (store, rank, size)
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")
    handler.unison_fallback = True  # type: ignore[attr-defined]
    return handler
