"""Waiting with a deadline, by polling: a condition, or nonblocking MPI requests.

A blocking MPI call has no deadline, and MPICH's spins a core while it waits; so start-up's reports
(`unison._job.startup`), the exit agreement (`unison._job.failure`), the liveness probes
(`unison.backends._liveness`) and the test suite's barrier (`unison.testing._barrier`) post nonblocking
requests and poll them here, sleeping between looks: from `first_sleep`, doubling up to `max_sleep`
(equal for a steady pace).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["poll", "wait_requests"]


def poll(deadline: float, ready: Callable[[], bool], first_sleep: float = 0.005, max_sleep: float = 0.05) -> bool:
    """Ask `ready` until it holds (True) or the monotonic `deadline` has passed (False); it is asked once
    more after each sleep, and at least once.

    Example:
        >>> poll(time.monotonic() + 1.0, lambda: True), poll(time.monotonic(), lambda: False)
        (True, False)
    """
    delay = first_sleep
    while not ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, max_sleep)
    return True


def wait_requests(requests: dict[int, MPI.Request], deadline: float, statuses: dict[int, MPI.Status] | None = None,
                  first_sleep: float = 0.005, max_sleep: float = 0.05) -> list[int]:
    """Poll `requests` (rank -> request) until every one completed or the deadline passed; return the
    ranks still waiting, sorted (completed ones leave `requests`). A completed request's status goes to
    ``statuses[rank]`` when given: a completed request has none left to ask for afterwards.
    """
    def ready() -> bool:
        done = [key for key, request in requests.items()
                if request.Test(statuses.get(key) if statuses else None)]
        for key in done:
            del requests[key]
        return not requests

    poll(deadline, ready, first_sleep, max_sleep)
    return sorted(requests)
