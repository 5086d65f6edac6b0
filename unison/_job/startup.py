"""The start-up check of `init()`: every rank arrives and reports its local set-up, each wait bounded.

Over MPI (`check_start`): `init()` runs collective MPI steps (topology, settings agreement, communicators, process sets) that
block, spinning a core, for as long as one rank is missing. So before any of them, every rank sends
rank 0 a short report over point-to-point messages: "ready", or the error its local set-up raised
(a bad setting, a timeline file it cannot write). Rank 0 answers every rank with the verdict. A rank
that does not arrive within `UNISON_START_TIMEOUT_SECONDS` (it raised before `init()`, is stuck, or
already left after an earlier shutdown) is named in the error the others raise; a rank whose set-up
failed is named with its error. Waits poll nonblocking requests with sleeps, like the control plane.

Over a torch store (`check_start_in_store`, a job that met at one): the same reports as keys, rank 0's
verdict as a key every rank waits for; a report also carries the world size the rank was given and
its host, and a rank claimed by two processes, or a world size that differs between ranks, is named.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..backends._polling import poll, wait_requests
from ..errors import StartupError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["REPORT_BYTES", "Arrival", "check_start", "check_start_in_store", "guard_mpi_start", "store_verdict",
           "verdict", "verdict_message"]

_TAG_REPORT = 7311
_TAG_VERDICT = 7312
REPORT_BYTES = 1024  # a rank's report, truncated to this
_VERDICT_BYTES = 16384  # rank 0's answer, JSON, bounded to this (the receivers' buffer)
_VERDICT_CHARS = _VERDICT_BYTES // 2  # the verdict's text, cut to this before it is encoded


def verdict(reports: dict[int, str], missing: list[int], timeout_seconds: float,
            bound_by: str = "UNISON_START_TIMEOUT_SECONDS sets the wait") -> str:
    """The start-up error text for every rank ('' when all arrived and reported ready). Pure.

    Args:
        reports: rank -> its local set-up error ('' for ready), for the ranks that arrived.
        missing: ranks that did not arrive in time.
        timeout_seconds: the bound they missed.
        bound_by: what sets the bound, for the message.

    Example:
        >>> verdict({0: "", 1: ""}, [2], 60.0)[:63]
        'init() failed: rank 2 did not reach init() within 60 s (it rais'
    """
    problems = []
    if missing:
        one = len(missing) == 1
        who, each, whose = (f"rank {missing[0]}", "it", "its") if one else (f"ranks {missing}", "each", "their")
        problems.append(
            f"{who} did not reach init() within {timeout_seconds:g} s ({each} raised or exited before "
            f"init(), is stuck before it, or already left the job); check {whose} output. {bound_by}"
        )
    for rank in sorted(reports):
        if reports[rank]:
            problems.append(f"rank {rank} could not start: {reports[rank].rstrip('.')}")
    if not problems:
        return ""
    return "init() failed: " + "; ".join(problems) + "."


def verdict_message(text: str, missing: Sequence[int], limit_bytes: int = _VERDICT_BYTES) -> bytes:
    """Rank 0's answer, JSON ``{"text": ..., "missing": [ranks]}``, cut to at most `limit_bytes`. Pure.

    The receivers' buffer holds `limit_bytes`, and JSON escapes each non-ASCII character to 6 bytes or
    more, so the cut is measured on the encoded message: ``missing`` keeps the ranks that fit in half
    of it, and the text is cut (ending in ``...``) to what fits in the rest. The result always parses.

    Example:
        >>> message = verdict_message("é" * 5000, list(range(1, 5000)), 4096)
        >>> told = json.loads(message)
        >>> len(message) <= 4096, told["text"][-4:], told["missing"][:3]
        (True, 'é...', [1, 2, 3])
    """
    ranks = list(missing)
    if len(json.dumps(ranks)) > limit_bytes // 2:
        ranks = ranks[:_longest(len(ranks), lambda n: len(json.dumps(ranks[:n])) <= limit_bytes // 2)]

    def encoded(shown: str) -> bytes:
        return json.dumps({"text": shown, "missing": ranks}).encode()

    if len(text) > _VERDICT_CHARS:
        text = text[: _VERDICT_CHARS - 3] + "..."
    if len(encoded(text)) <= limit_bytes:
        return encoded(text)
    return encoded(text[:_longest(len(text), lambda n: len(encoded(text[:n] + "...")) <= limit_bytes)] + "...")


def _longest(count: int, fits: Callable[[int], bool]) -> int:
    """The largest n in range(count + 1) with `fits(n)`, for a `fits` that holds up to some n and not after."""
    low, high = 0, count
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _report(problem: str) -> bytes:
    """A rank's report as sent: UTF-8 (any text: what UTF-8 cannot encode as its escape), cut to `REPORT_BYTES`."""
    return problem.encode("utf-8", "backslashreplace")[:REPORT_BYTES]


def _text(buffer: np.ndarray, status: MPI.Status) -> str:
    return bytes(buffer[: status.Get_count()]).decode("utf-8", "replace")


def check_start(comm: MPI.Comm, mpi: ModuleType, problem: str, timeout_seconds: float) -> None:
    """Collective over `comm`: raise `StartupError` on every rank that can be told, unless every rank
    arrived within the bound and reported `problem == ''`.

    A rank whose own `problem` is not empty raises too (the caller then re-raises its own error).
    `timeout_seconds <= 0` waits forever.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    bound = timeout_seconds if timeout_seconds > 0 else float("inf")
    report = np.frombuffer(_report(problem), dtype=np.uint8).copy()
    if rank != 0:
        sent = comm.Isend([report, mpi.BYTE], dest=0, tag=_TAG_REPORT)
        answer = np.zeros(_VERDICT_BYTES, dtype=np.uint8)
        status = mpi.Status()
        request = comm.Irecv([answer, mpi.BYTE], source=0, tag=_TAG_VERDICT)
        # Rank 0 answers once the last rank arrived or its own bound passed: allow for both.
        if wait_requests({0: request}, time.monotonic() + 2 * bound + 5.0, {0: status}):
            raise StartupError(verdict({}, [0], timeout_seconds), (0,))
        sent.Wait()  # rank 0 received the report before it answered
        told = json.loads(_text(answer, status))
        if told["text"]:
            raise StartupError(told["text"], tuple(told["missing"]))
        return
    buffers = {r: np.zeros(REPORT_BYTES, dtype=np.uint8) for r in range(1, size)}
    statuses = {r: mpi.Status() for r in range(1, size)}
    requests = {r: comm.Irecv([buffers[r], mpi.BYTE], source=r, tag=_TAG_REPORT) for r in range(1, size)}
    pending = dict(requests)
    missing = wait_requests(pending, time.monotonic() + bound, statuses)
    reports = {0: _report(problem).decode("utf-8", "replace")}  # cut as every other rank's is
    for r in range(1, size):
        if r not in missing:
            reports[r] = _text(buffers[r], statuses[r])
    message = verdict_message(verdict(reports, missing, timeout_seconds), missing)
    text = json.loads(message)["text"]
    payload = np.frombuffer(message, dtype=np.uint8).copy()
    sends = [comm.Isend([payload, mpi.BYTE], dest=r, tag=_TAG_VERDICT) for r in range(1, size) if r not in missing]
    wait_requests(dict(enumerate(sends)), time.monotonic() + 5.0)
    if text:
        raise StartupError(text, tuple(missing))


class Arrival(NamedTuple):
    """A rank's report at a store: the world size it was given, its host and pid, its set-up error ('' for ready)."""

    size: int
    host: str
    pid: int
    problem: str


_STORE_BOUND = "the timeout of init_process_group, or UNISON_START_TIMEOUT_SECONDS where shorter, sets the wait"


def store_verdict(arrivals: Mapping[int, Arrival], size: int, timeout_seconds: float) -> str:
    """Rank 0's start-up error text at a store ('' when every rank of `size` arrived ready). Pure.

    Example:
        >>> a = Arrival(2, "h", 1, "")
        >>> store_verdict({0: a, 1: a}, 2, 60.0)
        ''
        >>> store_verdict({0: a, 1: Arrival(3, "h", 2, "")}, 2, 60.0)[:92]
        'init() failed: the world size differs between ranks: 2 on rank [0]; 3 on rank [1]. Pass the '
    """
    sizes: dict[int, list[int]] = {}
    for rank in sorted(arrivals):
        sizes.setdefault(arrivals[rank].size, []).append(rank)
    if len(sizes) > 1:
        listing = "; ".join(f"{n} on rank{'s' if len(r) > 1 else ''} {r}" for n, r in sizes.items())
        return (f"init() failed: the world size differs between ranks: {listing}. Pass the same world_size to "
                "init_process_group on every rank (WORLD_SIZE in the environment of each).")
    missing = [r for r in range(size) if r not in arrivals]
    return verdict({r: a.problem for r, a in arrivals.items()}, missing, timeout_seconds, _STORE_BOUND)


def _arrival(raw: bytes) -> Arrival:
    told = json.loads(raw)
    return Arrival(int(told["size"]), str(told["host"]), int(told["pid"]), str(told["problem"]))


def _held_back(missing: Sequence[int], size: int) -> str:
    """What to add when rank 0 is among the missing ranks with others ('' otherwise). Pure.

    Example:
        >>> _held_back([0, 2], 3)[:60]
        ' Rank 0 may be missing only because rank 2 is: with tcp:// a'
    """
    others = [r for r in missing if r != 0]
    if 0 not in missing or not others:
        return ""
    who = f"rank {others[0]} is" if len(others) == 1 else f"ranks {others} are"
    return (f" Rank 0 may be missing only because {who}: with tcp:// and env:// it waits in torch's "
            f"rendezvous until all {size} processes of the world size connected to its store; check that "
            f"{size} processes were started (mp.spawn's nprocs, torchrun's --nproc-per-node), with ranks 0 to "
            f"{size - 1}.")


def _first_verdict(store: Any, ours: str) -> str:
    """Write `ours` as the verdict unless one is there already; return the verdict that stands. A store
    without an atomic compare-and-set (one written in Python) takes ours as it did before."""
    try:
        return str(store.compare_set("verdict", "", ours).decode())
    except (RuntimeError, NotImplementedError, AttributeError):
        store.set("verdict", ours)
        return ours


def check_start_in_store(store: Any, rank: int, size: int, problem: str, timeout_seconds: float,
                         host: str) -> dict[int, Arrival]:
    """Collective over the processes that met at `store` (keys of one job: the caller prefixes them):
    every rank's `Arrival` once each of the `size` ranks arrived within the bound and reported ready;
    else `StartupError` on every rank that can be told.

    Each process claims its rank first: the second process to claim one is refused at once, naming
    both. Rank 0 gathers the reports and writes the verdict; the others wait for it (rank 0 waits for
    the last rank up to the bound, so they allow twice that) and, when it never comes, name from the
    reports they can see which ranks did not arrive (after the bound, where rank 0 never reported);
    whichever verdict is written first stands for every rank, so a rank 0 that arrives after the
    others gave up fails as they did. `timeout_seconds <= 0` waits forever.
    """
    bound = timeout_seconds if timeout_seconds > 0 else float("inf")
    me = Arrival(size, host, os.getpid(), problem[:REPORT_BYTES])
    if store.add(f"claim/{rank}", 1) > 1:
        poll(time.monotonic() + 5.0, lambda: bool(store.check([f"report/{rank}"])))
        first = _arrival(store.get(f"report/{rank}")) if store.check([f"report/{rank}"]) else None
        who = f"{first.host}, pid {first.pid}" if first else "another process"
        raise StartupError(
            f"init() failed: two processes claim rank {rank}: {who} came first, this one ({host}, pid "
            f"{os.getpid()}) second. Give each process its own rank (rank=... of init_process_group, or RANK).",
            ())
    store.set(f"report/{rank}", json.dumps(me._asdict()))
    if rank != 0:
        zero: list[bool] = []  # whether rank 0 reported: it did not when torch's rendezvous held it

        def told_or_seen() -> bool:
            if not zero and store.check(["report/0"]):
                zero.append(True)
            return bool(store.check(["verdict"]))

        try:
            # Rank 0 reports before it waits for the others, so one that has not reported after the
            # bound never reached unison's start: no verdict is coming, and the others are named now.
            told = poll(time.monotonic() + bound + 5.0, told_or_seen)
            if not told and (zero or store.check(["report/0"])):  # rank 0 waits for the last rank, up
                told = poll(time.monotonic() + bound, told_or_seen)  # to the bound: allow it that
            if not told:
                seen = [r for r in range(size) if store.check([f"report/{r}"])]
                missing = [r for r in range(size) if r not in seen] or [0]  # rank 0 never answered
                text = verdict({}, missing, timeout_seconds, _STORE_BOUND) + _held_back(missing, size)
                # The verdict is this one unless rank 0's came first: a rank 0 that arrives later finds
                # it and fails too, where it would have gone on without the ranks that gave up.
                ours = json.dumps({"text": text, "missing": missing, "arrivals": {}})
                if _first_verdict(store, ours) == ours:
                    raise StartupError(text, tuple(missing))
            told = json.loads(store.get("verdict"))
            store.add("verdict/read", 1)
        except StartupError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch's store errors: its host (rank 0, or an agent) is gone
            why = (" Rank 0 never reached unison's start: with tcp:// and env:// it waits in torch's rendezvous "
                   "until every process of the world size connected to its store, so a process of the job did not "
                   "arrive (rank 0's output says how many did)." if not zero else "")
            raise StartupError(
                f"init() failed: the store the ranks meet at stopped answering before rank 0 said whether every "
                f"rank arrived ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). The process "
                f"that hosts it (rank 0, for tcp:// and env://) failed or left: check its output.{why}",
                (0,)) from None
        given = {int(r): Arrival(*row) for r, row in told["arrivals"].items()}
        if told["text"]:
            raise StartupError(told["text"], tuple(told["missing"]))
        if len(given) != size:  # rank 0 was given another world size and did not wait for this rank
            raise StartupError(store_verdict({**given, rank: me}, size, timeout_seconds), ())
        return given
    arrivals: dict[int, Arrival] = {0: me}

    def arrived() -> bool:
        for r in range(1, size):
            if r not in arrivals and store.check([f"report/{r}"]):
                arrivals[r] = _arrival(store.get(f"report/{r}"))
                if arrivals[r].size != size:
                    return True  # a world size of its own: no need to wait for the rest
        return len(arrivals) == size

    poll(time.monotonic() + bound, arrived)
    text = store_verdict(arrivals, size, timeout_seconds)
    missing = [r for r in range(size) if r not in arrivals]
    ours = json.dumps({"text": text, "missing": missing, "arrivals": {r: list(a) for r, a in arrivals.items()}})
    written = _first_verdict(store, ours)
    if written != ours:  # the others gave up waiting for this rank first: their verdict stands
        told = json.loads(written)
        raise StartupError(told["text"], tuple(told["missing"]))
    if text:
        # rank 0 often hosts the store (tcp://, env://): its end would cut the others off from the verdict
        poll(time.monotonic() + 5.0, lambda: store.add("verdict/read", 0) >= len(arrivals) - 1)
        raise StartupError(text, tuple(missing))
    return arrivals


# The watchdog of MPI's own start-up: a separate process, since MPI_Init holds the GIL (no thread of
# this process runs) while it waits for every process of the launch. It waits for its stdin to close
# (this process is past MPI_Init) and otherwise, after the bound, explains and ends this process.
_WATCHDOG = """
import os, select, signal, sys
parent, seconds, text = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(text + "\\n")
    sys.stderr.flush()
    try:
        os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


@contextlib.contextmanager
def guard_mpi_start(timeout_seconds: float, launched: int) -> Iterator[None]:
    """Bound MPI's start-up (``MPI_Init``), which waits, spinning, for every process of the launch.

    When one of them raised or exited before `init()`, the others would wait forever; after
    `timeout_seconds` a watchdog process prints why and kills this one, so the launcher ends the job.
    Does nothing for a job of one process, once MPI is initialized, or with a bound of 0. (mpi4py's
    module may be imported without MPI running, under ``mpi4py.rc.initialize = False``.)
    """
    imported = sys.modules.get("mpi4py.MPI")
    if launched < 2 or timeout_seconds <= 0 or (imported is not None and imported.Is_initialized()):
        yield
        return
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    text = (f"unison: rank {rank} ({socket.gethostname()}, pid {os.getpid()}) waited {timeout_seconds:g} s "
            f"in MPI's start-up for the other processes of the launch ({launched} in all); one of them "
            "raised or exited before init(), or is stuck before it: check the output of the other ranks. "
            "Stopping this process (UNISON_START_TIMEOUT_SECONDS sets the wait).")
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout_seconds), text],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True,
        )
    except OSError:  # no watchdog: MPI's start-up is then as unbounded as it always was
        yield
        return
    try:
        yield
    finally:
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        watchdog.wait()
