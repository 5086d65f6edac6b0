"""A named barrier with a timeout: every rank says which point of a test suite it has reached.

Every rank sends the name of the point it has reached (``the start of <test id>``, ``the end of
<test id>``, ``the end of the session``) to every other rank on a communicator of the barrier's own,
then polls the receives until all have arrived or the deadline passes. This is a barrier that also
says *who* is missing and *where* everyone is, which ``MPI_Ibarrier`` cannot. The message formatting
is pure and unit-tested in ``tests/unit/testing/test_harness_helpers.py``; mpi4py is imported only by the MPI
parts. `unison.testing.pytest_plugin` puts one around every test.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..backends._polling import wait_requests

if TYPE_CHECKING:
    from mpi4py import MPI

NAME_BYTES = 200
DIGEST_CHARS = 16
DEFAULT_BARRIER_SECONDS = 60.0
BARRIER_SECONDS_VARIABLE = "UNISON_TEST_BARRIER_SECONDS"
END_OF_SESSION = "the end of the session"
_TAG = 7321  # any tag works: the barrier's communicator carries nothing else
_POLL_SECONDS = 0.001


class BarrierTimeout(Exception):
    """Some ranks did not reach a named barrier in time."""

    def __init__(self, message: str, missing_ranks: list[int], pending: list[MPI.Request]) -> None:
        super().__init__(message)
        self.missing_ranks = missing_ranks
        # Requests still in flight; their buffers must stay alive until they complete.
        self.pending = pending


def barrier_seconds(environ: Mapping[str, str]) -> float:
    """Return the barrier timeout from ``UNISON_TEST_BARRIER_SECONDS``, or the 60 s default."""
    raw = environ.get(BARRIER_SECONDS_VARIABLE)
    if raw is None or raw.strip() == "":
        return DEFAULT_BARRIER_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            f"{BARRIER_SECONDS_VARIABLE} must be a positive number of seconds. Got {raw!r}."
        )
    return seconds


def encode_name(name: str) -> bytes:
    """Encode a barrier name into exactly ``NAME_BYTES`` bytes.

    A digest of the full name leads, so two long names that share their first bytes still differ.
    """
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
    raw = f"{digest} {name}".encode()[:NAME_BYTES]
    return raw.ljust(NAME_BYTES, b"\0")


def decode_name(buffer: bytes | bytearray) -> str:
    """Return the readable name from an encoded buffer.

    A name cut to fit keeps its digest, so two cut names compare equal only if the full names do.
    """
    raw = bytes(buffer).rstrip(b"\0")
    digest, _, name = raw.decode("utf-8", errors="replace").partition(" ")
    return f"{name}... [{digest}]" if len(raw) == NAME_BYTES else name


def _ranks_phrase(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]} is" if len(ranks) == 1 else f"ranks {list(ranks)} are"


def describe_mismatch(names_by_rank: Mapping[int, str]) -> str | None:
    """Say which rank is at which point, or return None when all ranks are at the same point.

    For ``{0: "before a", 1: "before b", 2: "before a"}`` the message begins
    ``ranks are not at the same point of the suite: ranks [0, 2] are at 'before a'; rank 1 is at
    'before b'``.
    """
    groups: dict[str, list[int]] = {}
    for rank in sorted(names_by_rank):
        groups.setdefault(names_by_rank[rank], []).append(rank)
    if len(groups) <= 1:
        return None
    where = "; ".join(f"{_ranks_phrase(ranks)} at {name!r}" for name, ranks in groups.items())
    return (
        f"ranks are not at the same point of the suite: {where}. Every rank must run the same tests "
        "in the same order: look for a skip, a collection error or a parametrization that differs "
        "between ranks."
    )


def describe_timeout(missing_ranks: Sequence[int], name: str, timeout_seconds: float) -> str:
    """Name the ranks that did not reach barrier ``name`` in time."""
    return (
        f"ranks {sorted(missing_ranks)} did not reach the barrier for {name} within "
        f"{timeout_seconds:g} s"
    )


def _report_and_dump(me: int, identities: Sequence[tuple[str, int]], message: str,
                     missing_ranks: Sequence[int]) -> None:
    """Print why the job ends, and send SIGUSR1 (a stack dump) to the missing ranks on this host."""
    print(f"\nFATAL (rank {me}): {message}; aborting the job", file=sys.stderr, flush=True)
    host = socket.gethostname()
    for rank in missing_ranks:
        rank_host, pid = identities[rank]
        if rank_host == host:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(1.0)  # let the stack dumps reach the logs


class NamedBarrier:
    """A duplicate of a communicator, used only for named barriers with a timeout."""

    def __init__(self, comm: MPI.Comm) -> None:
        # Collective, and without a timeout: every rank builds this while configuring pytest.
        self.comm = comm.Dup()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.identities: list[tuple[str, int]] = self.comm.allgather((socket.gethostname(), os.getpid()))
        self.count = 0

    def __repr__(self) -> str:
        return f"NamedBarrier(rank={self.rank}, size={self.size}, barriers={self.count})"

    def wait(self, name: str, timeout_seconds: float) -> dict[int, str]:
        """Wait until every rank reaches a barrier; return the name each rank gave it.

        Raises:
            BarrierTimeout: some ranks did not arrive within ``timeout_seconds``.
        """
        from mpi4py import MPI

        self.count += 1
        others = [rank for rank in range(self.size) if rank != self.rank]
        outgoing = encode_name(name)
        incoming = {rank: bytearray(NAME_BYTES) for rank in others}
        receives = {
            rank: self.comm.Irecv([incoming[rank], MPI.BYTE], source=rank, tag=_TAG) for rank in others
        }
        sends = [self.comm.Isend([outgoing, MPI.BYTE], dest=rank, tag=_TAG) for rank in others]
        deadline = time.monotonic() + timeout_seconds
        missing = wait_requests(dict(receives), deadline, first_sleep=_POLL_SECONDS, max_sleep=_POLL_SECONDS)
        if missing:
            raise BarrierTimeout(
                describe_timeout(missing, name, timeout_seconds), missing,
                [receives[rank] for rank in missing] + sends
            )
        # Every other rank has arrived and so has posted its receives: the sends complete.
        wait_requests(dict(enumerate(sends)), deadline + timeout_seconds, first_sleep=_POLL_SECONDS,
                      max_sleep=_POLL_SECONDS)
        names = {rank: decode_name(buffer) for rank, buffer in incoming.items()}
        names[self.rank] = decode_name(outgoing)
        return names

    def abort(self, message: str, missing_ranks: Sequence[int]) -> None:
        """Report ``message``, ask the missing ranks for their stacks, and end the whole job.

        After a barrier timeout the ranks disagree about what runs next, so nothing can continue.
        Missing ranks on this host get SIGUSR1, which the pytest plugin turns into a stack dump.
        """
        _report_and_dump(self.rank, self.identities, message, missing_ranks)
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)



class StoreBarrier:
    """The same named barrier over torch's store, for a suite run by torchrun (no MPI).

    Every rank writes the name of the point it has reached under ``<count>/<rank>`` and waits for
    the others' keys of that count, as the MPI barrier's k-th messages meet: a rank that ran fewer
    tests meets the others' next point, and the mismatch names both.
    """

    def __init__(self, store: Any, rank: int, size: int) -> None:
        # Any: torch's Store, whose stubs type a value as str where it takes bytes too
        self.store, self.rank, self.size = store, rank, size
        store.set(f"id/{rank}", f"{socket.gethostname()} {os.getpid()}")
        store.wait([f"id/{r}" for r in range(size)])
        pairs = [store.get(f"id/{r}").decode().rsplit(" ", 1) for r in range(size)]
        self.identities: list[tuple[str, int]] = [(host, int(pid)) for host, pid in pairs]
        self.count = 0

    def __repr__(self) -> str:
        return f"StoreBarrier(rank={self.rank}, size={self.size}, barriers={self.count})"

    def wait(self, name: str, timeout_seconds: float) -> dict[int, str]:
        """Wait until every rank reaches a barrier; return the name each rank gave it.

        Raises:
            BarrierTimeout: some ranks did not arrive within ``timeout_seconds``.
        """
        from datetime import timedelta

        self.count += 1
        outgoing = encode_name(name)
        self.store.set(f"{self.count}/{self.rank}", outgoing)
        keys = {rank: f"{self.count}/{rank}" for rank in range(self.size) if rank != self.rank}
        try:
            self.store.wait(list(keys.values()), timedelta(seconds=timeout_seconds))
        except Exception:  # noqa: BLE001 - torch raises its own timeout (a RuntimeError or DistStoreError)
            missing = [rank for rank, key in keys.items() if not self.store.check([key])]
            if not missing:  # arrived just as the wait gave up
                return self._names(keys, outgoing)
            raise BarrierTimeout(describe_timeout(missing, name, timeout_seconds), missing, []) from None
        return self._names(keys, outgoing)

    def _names(self, keys: Mapping[int, str], outgoing: bytes) -> dict[int, str]:
        names = {rank: decode_name(self.store.get(key)) for rank, key in keys.items()}
        names[self.rank] = decode_name(outgoing)
        return names

    def abort(self, message: str, missing_ranks: Sequence[int]) -> None:
        """Report ``message``, ask the missing ranks on this host for their stacks, and end this rank:
        torchrun then stops the others."""
        _report_and_dump(self.rank, self.identities, message, missing_ranks)
        os._exit(1)


def torch_store_barrier(environ: Mapping[str, str]) -> StoreBarrier | None:
    """The store barrier of a job launched by torchrun (torch's env:// variables, no MPI launcher),
    on the store the job meets at (`unison._job.torch_launch.env_store`) under a prefix of its own;
    None for any other launch."""
    from .._job.torch_launch import env_store, torch_launch

    launch = torch_launch(environ)
    if launch is None:
        return None
    import torch.distributed as dist

    store = env_store(launch, 300.0)
    return StoreBarrier(dist.PrefixStore(f"unison-test/{launch.restart}", store), launch.rank, launch.size)
