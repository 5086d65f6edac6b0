"""What every rank does with a response of each kind: a table of plain data, read by the engine's loop.

A response either stops the job (shutdown, stall, abort), changes this rank's state without moving
tensor data (fail some tensors, end a join, add or remove a process set), completes handles (a
barrier), or runs a collective on the data plane. The engine looks the kind up here and calls the
one action the table names, so which kinds need this rank to be a member of the response's process
set, and which kinds end the job, are decided in one place that is tested without threads or MPI.

Example:
    >>> route(Kind.ALLGATHER)
    Route(action=<Action.RUN: 'run'>, members_only=True)
    >>> route(Kind.STALL).action.stops
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..ops import Kind, TextEnum

__all__ = ["ROUTES", "Action", "Route", "route"]


class Action(TextEnum):
    """What the engine does with a response.

    ``STOP_*`` end the job on every rank with the error of that name (`ShutdownError`,
    `StallError`, `AbortedError`); ``FAIL`` fails the named tensors with the response's message;
    ``JOIN`` completes this rank's join; ``ADD_PROCESS_SET`` and ``REMOVE_PROCESS_SET`` change the
    registered sets; ``BARRIER`` completes the waiting handles; ``RUN`` hands the response to the
    executor (the CPU data plane, or the GPU plane for device buffers); ``TUNE`` is applied at the
    end of the cycle instead (`unison.protocol.autotune.split_tuning` takes it out first).
    """

    STOP_SHUTDOWN = "stop_shutdown"
    STOP_STALL = "stop_stall"
    STOP_ABORT = "stop_abort"
    FAIL = "fail"
    JOIN = "join"
    ADD_PROCESS_SET = "add_process_set"
    REMOVE_PROCESS_SET = "remove_process_set"
    BARRIER = "barrier"
    RUN = "run"
    TUNE = "tune"

    @property
    def stops(self) -> bool:
        """Whether the action ends the job (no response after it runs)."""
        return self in _STOPS


_STOPS = frozenset({Action.STOP_SHUTDOWN, Action.STOP_STALL, Action.STOP_ABORT})


@dataclasses.dataclass(frozen=True)
class Route:
    """Where one kind of response goes.

    Attributes:
        action: what the engine does with it.
        members_only: only ranks in the response's process set act on it; the others skip it
            (they still see it, in the same order, so their caches and plans stay equal).
    """

    action: Action
    members_only: bool


ROUTES: Mapping[Kind, Route] = {
    Kind.SHUTDOWN: Route(Action.STOP_SHUTDOWN, members_only=False),
    Kind.STALL: Route(Action.STOP_STALL, members_only=False),
    Kind.ABORT: Route(Action.STOP_ABORT, members_only=False),
    Kind.ERROR: Route(Action.FAIL, members_only=False),
    Kind.JOIN: Route(Action.JOIN, members_only=False),
    # Every rank registers a set, members or not: process set ids are global.
    Kind.ADD_PROCESS_SET: Route(Action.ADD_PROCESS_SET, members_only=False),
    Kind.REMOVE_PROCESS_SET: Route(Action.REMOVE_PROCESS_SET, members_only=False),
    Kind.BARRIER: Route(Action.BARRIER, members_only=True),
    Kind.ALLREDUCE: Route(Action.RUN, members_only=True),
    Kind.ALLGATHER: Route(Action.RUN, members_only=True),
    Kind.BROADCAST: Route(Action.RUN, members_only=True),
    Kind.ALLTOALL: Route(Action.RUN, members_only=True),
    Kind.REDUCESCATTER: Route(Action.RUN, members_only=True),
    Kind.TUNE: Route(Action.TUNE, members_only=False),
}
"""Every `Kind` -> its `Route` (a unit test checks that no kind is missing)."""


def route(kind: Kind) -> Route:
    """Return where a response of `kind` goes.

    Example:
        >>> route(Kind.BARRIER).members_only
        True
    """
    return ROUTES[kind]
