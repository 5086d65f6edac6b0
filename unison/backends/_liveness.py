"""Liveness probes over MPI: tell a frozen or dead rank from a slow one when a control exchange waits too long.

A nonblocking collective that one rank never joins gives the others no hint of who is missing. So each
rank keeps a small responder thread on a communicator of its own that answers probes; a rank whose
control exchange has waited `UNISON_PEER_TIMEOUT_SECONDS` probes every peer, and the peers that do not
answer within `probe_window` (that time, at most `PROBE_WINDOW_SECONDS`) are the ones lost. The answer
comes from the responder thread, which polls every 50 ms and needs only the GIL for a moment: 3 s
covers a loaded machine many times over, where the full timeout again (10 s by default) only delayed
the end of a job with a frozen rank. A live rank answers even while its engine is
busy in a long data-plane call (mpi4py releases the GIL in MPI calls), so a slow peer is never taken
for a lost one; a frozen process (SIGSTOP, a debugger), a dead one that MPI did not notice, or an
unreachable host does not answer.

An answer also says whether the rank waits in a control exchange, and how many data-plane calls it
has completed on the process set the prober names (every member makes the same calls on a set, in the
same order). A rank blocked in a data-plane call for the timeout whose peer answers, alive, from a
control exchange having completed no more calls on that set than the prober (so not this one), and
still does at each of a few more probes over the probe window, waits for a peer that moved on to its
next cycle without the collective every member had agreed to run: its executor failed before the
transport on that rank alone, and the others' calls cannot be interrupted. The job cannot go on; the
watch says who. A peer that completed the call (some collectives let a member finish its part before a
late one arrives) or is anywhere else (executing a response, waiting for its device) may still come.

Both sides poll nonblocking requests with sleeps (MPICH's blocking calls would spin a core), and both
need MPI_THREAD_MULTIPLE, since the responder talks while the engine thread does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ._polling import wait_requests

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["ABSENT_PROBES", "PROBE_WINDOW_SECONDS", "Liveness", "probe_window"]

_PING_TAG = 7301
_PONG_TAG = 7302
_POLL_SECONDS = 0.05
PROBE_WINDOW_SECONDS = 3.0
ABSENT_PROBES = 3
"""How many more probes, over the probe window, must find a live member behind, in a control exchange."""
# An answer's second word: whether the rank waits in a control exchange (`Liveness._where`).
_IN_CONTROL, _ELSEWHERE = 1, 0


def probe_window(timeout_seconds: float) -> float:
    """How long a probe sent after `timeout_seconds` of waiting waits for the answers.

    Example:
        >>> probe_window(10.0), probe_window(2.0)
        (3.0, 2.0)
    """
    return min(timeout_seconds, PROBE_WINDOW_SECONDS)


class Liveness:
    """A responder thread on a duplicate of `comm`, and `probe()` to find the peers that do not answer.

    Args:
        comm: the job's communicator (duplicated here: collective over its ranks).
        mpi: the mpi4py MPI module.
    """

    def __init__(self, comm: MPI.Comm, mpi: ModuleType) -> None:
        self._mpi = mpi
        self._comm = comm.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._closing = threading.Event()
        self._probes = 0
        self._answered = 0
        self._in_control: Callable[[], bool] = lambda: False  # set by `watch_data_plane`
        self._done: Callable[[int], int] = lambda process_set_id: 0  # set by `watch_data_plane`
        self._thread = threading.Thread(target=self._respond, name=f"unison-liveness-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Liveness rank={self.rank} size={self.size} probes={self._probes} answered={self._answered}>"

    def statistics(self) -> dict[str, int]:
        """Counters: probes this rank sent, probes it answered."""
        return {"probes": self._probes, "answered": self._answered}

    def _where(self) -> int:
        """This rank's answer's second word: whether it waits in a control exchange now."""
        return _IN_CONTROL if self._in_control() else _ELSEWHERE

    def _respond(self) -> None:
        ping = np.zeros(2, dtype=np.int64)  # [token, the process set asked about]
        status = self._mpi.Status()
        request = self._comm.Irecv(ping, source=self._mpi.ANY_SOURCE, tag=_PING_TAG)
        replies: list[MPI.Request] = []
        try:
            while not self._closing.is_set():
                if not request.Test(status):
                    time.sleep(_POLL_SECONDS)
                    continue
                source = status.Get_source()
                replies = [r for r in replies if not r.Test()]
                pong = np.array([ping[0], self._where(), self._done(int(ping[1]))], dtype=np.int64)
                replies.append(self._comm.Isend(pong, dest=source, tag=_PONG_TAG))
                self._answered += 1
                request = self._comm.Irecv(ping, source=self._mpi.ANY_SOURCE, tag=_PING_TAG)
        except Exception:  # noqa: BLE001 - MPI is finalizing or the communicator is gone: stop answering
            return
        try:
            request.Cancel()
        except Exception:  # noqa: BLE001
            pass

    def probe(self, window_seconds: float) -> list[int]:
        """Ask every other rank for a sign of life; return those that gave none within the window."""
        return self._ask(window_seconds, 0, 0)[0]

    def _ask(self, window_seconds: float, process_set_id: int, done: int) -> tuple[list[int], set[int]]:
        """Probe every other rank: (those that gave no answer within the window, those that answered
        from a control exchange having completed at most `done` data-plane calls on the set)."""
        self._probes += 1
        token = np.array([self._probes, process_set_id], dtype=np.int64)
        sends = [self._comm.Isend(token, dest=r, tag=_PING_TAG) for r in range(self.size) if r != self.rank]
        answers = {r: np.zeros(3, dtype=np.int64) for r in range(self.size) if r != self.rank}
        waiting = {r: self._comm.Irecv(buf, source=r, tag=_PONG_TAG) for r, buf in answers.items()}
        silent = wait_requests(waiting, time.monotonic() + window_seconds, first_sleep=_POLL_SECONDS,
                               max_sleep=_POLL_SECONDS)
        del sends  # a send to a frozen rank may never complete; the job is being stopped then
        behind = {r for r, answer in answers.items()
                  if r not in silent and answer[1] == _IN_CONTROL and answer[2] <= done}
        return silent, behind

    def watch_data_plane(self, busy_since: Callable[[], float], in_control: Callable[[], bool],
                         members: Callable[[], Sequence[int]], data_set: Callable[[], int],
                         done: Callable[[int], int], timeout_seconds: float,
                         on_lost: Callable[[list[int], float], None],
                         on_absent: Callable[[list[int], float], None]) -> None:
        """Start a thread that probes the peers when one data-plane call has lasted `timeout_seconds`, and
        again every `timeout_seconds` while it lasts.

        A data-plane call blocks in MPI with no deadline (negotiation showed every member ready), so a
        peer frozen in the middle of one, or one that never joined it, would hold this rank forever, its
        engine unable to look. `busy_since()` is the monotonic start of the call in progress (0 when
        none), `members()` that call's ranks, `data_set()` its process set, `done(set)` how many
        data-plane calls this rank has completed on a set (not this one); from this thread,
        `on_lost(ranks, seconds)` is called when some peers do not answer a probe, and `on_absent(ranks,
        seconds)` when some members answer from a control exchange, behind on the set, at that probe
        and at `ABSENT_PROBES` more over the probe window. This rank's own answers say from then on
        whether it waits in a control exchange (`in_control()`) and how far it is on the set asked.
        """
        self._in_control, self._done = in_control, done
        window = probe_window(timeout_seconds)

        def run() -> None:
            looked = 0.0
            while not self._closing.wait(min(1.0, timeout_seconds / 2)):
                since = busy_since()
                now = time.monotonic()
                if not since or now - since < timeout_seconds or now - looked < timeout_seconds:
                    continue
                # A call still stuck is looked at again every timeout: a peer that was busy elsewhere
                # at one look may freeze, or fail before the transport, before the next.
                looked = now
                peers = set(members()) - {self.rank}
                process_set_id = data_set()
                mine = done(process_set_id)
                lost, behind = self._ask(window, process_set_id, mine)
                absent = behind & peers
                for _ in range(ABSENT_PROBES if absent and not lost else 0):
                    if self._closing.wait(window / ABSENT_PROBES) or busy_since() != since:
                        break
                    lost, behind = self._ask(window, process_set_id, mine)
                    absent &= behind
                    if lost or not absent:
                        break
                if busy_since() != since:
                    continue
                if lost:
                    on_lost(lost, time.monotonic() - since)
                    return
                if absent:
                    on_absent(sorted(absent), time.monotonic() - since)
                    return

        threading.Thread(target=run, name=f"unison-data-watch-{self.rank}", daemon=True).start()

    def close(self) -> None:
        """Stop answering and watching (local)."""
        self._closing.set()
        self._thread.join(1.0)
