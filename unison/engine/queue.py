"""The submission queue: what framework threads hand to the engine thread, which drains it each cycle.

Framework threads `put` groups of entries (one entry for an ordinary op), hold them inside `batch`
blocks, or ask the job to shut down or abort; the engine thread `take`s all of it at the start of a
cycle, in one step under one lock, so a cycle sees a consistent picture: what the main thread queued
before it started waiting goes out in the same cycle that reports the main thread as waiting.

The queue also enforces Horovod's naming rule at submission time: one user name is in flight under
one kind at a time on a rank, so a duplicate is refused at once in the thread that made it.

Example:
    >>> q = SubmissionQueue(lambda: RuntimeError("stopped"))
    >>> q.open()
    >>> q.request_shutdown()
    >>> q.take().shutdown, q.take().shutdown  # sent once
    (True, False)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from ..errors import DuplicateNameError
from ..protocol.messages import Request
from .handles import Entry, main_thread_waits

__all__ = ["Drained", "SubmissionQueue", "user_name"]


def user_name(name: str) -> str:
    """The user's part of a tensor name ``<kind>.<name>`` (the whole name when it has no kind).

    Example:
        >>> user_name("allreduce.grad/w"), user_name("plain")
        ('grad/w', 'plain')
    """
    return name.partition(".")[2] or name


class Drained(NamedTuple):
    """What one cycle takes from the queue (a named tuple: made every cycle, it must be cheap).

    Attributes:
        groups: the groups submitted since the last cycle, in submission order.
        shutdown: this rank asked to shut down, and the request has not been sent yet.
        abort_reason: why this rank is failing, when an abort was asked and not sent yet ("" if not).
        blocked: the main thread waits in unison and holds no `batch` open: it cannot submit more.
    """

    groups: list[list[Entry]]
    shutdown: bool
    abort_reason: str
    blocked: bool


class SubmissionQueue:
    """The groups framework threads submitted and the engine thread has not taken yet.

    Every method is safe from any thread. The queue refuses submissions until `open`, and again
    after `close`, raising the error `refusal` returns.

    Args:
        refusal: makes the error a refused submission raises (the engine's stop error).
    """

    def __init__(self, refusal: Callable[[], BaseException]) -> None:
        self._refusal = refusal
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._accepting = False
        self._groups: list[list[Entry]] = []
        self._held: dict[int, list[list[Entry]]] = {}  # thread id -> groups submitted inside batch()
        # user name -> full name, for what this rank submitted and has not completed: one user name
        # is in flight under one kind at a time (Horovod's rule), so a rank that asks for an allreduce
        # and a peer that asks for a broadcast under one name can be told apart from ranks that
        # merely submit in different orders (see unison.protocol.names).
        self._in_flight: dict[str, str] = {}
        self._shutdown_requested = False
        self._shutdown_sent = False
        self._abort_reason = ""  # this rank is failing: send the reason to the coordinator
        self._abort_sent = False

    def __repr__(self) -> str:
        queued, held = self.counts()
        return (f"<SubmissionQueue {'open' if self._accepting else 'closed'} queued={queued} "
                f"held={held} in_flight={len(self._in_flight)}>")

    def counts(self) -> tuple[int, int]:
        """Return (groups queued, groups held inside open `batch` blocks)."""
        with self._lock:
            return len(self._groups), sum(len(groups) for groups in self._held.values())

    def open(self) -> None:
        """Start accepting submissions."""
        self._accepting = True

    def put(self, entries: Sequence[Entry], *, wake: bool = True) -> None:
        """Submit entries as one atomic group and wake the engine thread (unless a `batch` holds them,
        or `wake` is False: the submitting thread runs the cycle itself, `Engine.drive`).

        Raises:
            DuplicateNameError: a name is already in flight on this rank.
            BaseException: what `refusal` returns, when the queue is not open.
        """
        group = list(entries)
        if len(group) > 1:
            for entry in group:
                entry.group = group
        with self._lock:
            if not self._accepting:
                raise self._refusal()
            names = [entry.request.name for entry in group]
            users = [user_name(name) for name in names]
            for entry, name, user in zip(group, names, users):
                other = self._in_flight.get(user)
                if other == name or (len(group) > 1 and names.count(name) > 1):
                    raise DuplicateNameError(
                        f"Requested to {entry.request.kind.value} a tensor named '{name}' while "
                        "another tensor with that name is still being processed on this rank. "
                        "Use a different name for each tensor in flight."
                    )
                if other is not None:
                    raise DuplicateNameError(
                        f"Requested to {entry.request.kind.value} a tensor named '{user}' while "
                        f"'{other}' is still being processed on this rank: one name is used by one "
                        "collective at a time. Use a different name for each tensor in flight."
                    )
            self._in_flight.update(zip(users, names))
            held = self._held.get(threading.get_ident())
            if held is not None:
                held.append(group)
                return
            self._groups.append(group)
        if wake:
            self._wake.set()

    def claim_idle(self, request: Request) -> bool | None:
        """Take `request`'s name into flight without queueing anything, when nothing is queued and no
        shutdown or abort waits to be sent (its thread runs its cycle at once, `Engine.run_now`);
        return whether no `batch` block is open on any thread, or None, having claimed nothing, when busy.

        Raises:
            DuplicateNameError: its name is already in flight on this rank.
        """
        name = request.name
        user = user_name(name)
        with self._lock:
            if (not self._accepting or self._groups or (self._shutdown_requested and not self._shutdown_sent)
                    or (self._abort_reason and not self._abort_sent)):
                return None
            other = self._in_flight.get(user)
            if other is not None:
                raise DuplicateNameError(
                    f"Requested to {request.kind.value} a tensor named '{user}' while '{other}' is "
                    "still being processed on this rank: one name is used by one collective at a time. "
                    "Use a different name for each tensor in flight."
                )
            self._in_flight[user] = name
            return not self._held

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold what this thread submits inside the block and queue it all at once when the block ends.

        Blocks may nest; the outermost one releases.
        """
        me = threading.get_ident()
        with self._lock:
            nested = me in self._held
            if not nested:
                self._held[me] = []
        try:
            yield
        finally:
            if not nested:
                with self._lock:
                    groups = self._held.pop(me, [])
                    self._groups.extend(groups)
                if groups:
                    self._wake.set()

    def release(self, name: str) -> None:
        """Forget that `name` is in flight (its collective ran, or failed): the name may be used again."""
        with self._lock:
            self._in_flight.pop(user_name(name), None)

    def request_shutdown(self) -> None:
        """Ask the engine thread to send this rank's shutdown request (once)."""
        with self._lock:
            self._shutdown_requested = True
        self._wake.set()

    def request_abort(self, reason: str) -> None:
        """Ask the engine thread to send this rank's failure to the coordinator (the first reason wins)."""
        with self._lock:
            if not self._abort_reason:
                self._abort_reason = reason
        self._wake.set()

    def has_work(self) -> bool:
        """Whether a `take` now would return something: groups, or a shutdown or abort not sent yet."""
        with self._lock:
            return (bool(self._groups) or (self._shutdown_requested and not self._shutdown_sent)
                    or (bool(self._abort_reason) and not self._abort_sent))

    def take(self) -> Drained:
        """Take everything queued, and the shutdown or abort to send; each is taken once."""
        with self._lock:
            groups, self._groups = self._groups, []
            shutdown = self._shutdown_requested and not self._shutdown_sent
            self._shutdown_sent = self._shutdown_sent or shutdown
            abort_reason = self._abort_reason if not self._abort_sent else ""
            self._abort_sent = self._abort_sent or bool(abort_reason)
            # Read with the queue taken: what the main thread queued before waiting goes out now.
            blocked = main_thread_waits() and not self._held
        return Drained(groups, shutdown, abort_reason, blocked)

    def close(self, *, keep_batches: bool = True) -> list[Entry]:
        """Refuse submissions from now on; return every queued and held entry (to fail them).

        Args:
            keep_batches: keep the open `batch` blocks known (emptied), so that a nested block does not
                mistake itself for the outermost; False forgets them (a forked child's copy).
        """
        with self._lock:
            self._accepting = False
            entries = [e for group in self._groups for e in group]
            entries += [e for groups in self._held.values() for group in groups for e in group]
            self._groups = []
            self._held = {thread: [] for thread in self._held} if keep_batches else {}
            self._in_flight.clear()
        return entries

    def wake(self) -> None:
        """Wake the engine thread from `wait`."""
        self._wake.set()

    def wait(self, timeout: float) -> bool:
        """Sleep until woken (True) or `timeout` seconds passed (False); the wake-up stays set until
        `clear_wake`."""
        return self._wake.wait(timeout)

    def clear_wake(self) -> None:
        """Forget past wake-ups: the next `wait` sleeps until a new one."""
        self._wake.clear()
