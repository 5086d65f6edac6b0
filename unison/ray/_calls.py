"""Send one call to every worker and wait for every rank's `Outcome`, passing logged values to the callbacks.

A rank's worker process can die (an `Outcome` of its own then names it), and after one rank failed
the others get `GRACE_SECONDS` to report how they ended: unison stops a job's other ranks within
milliseconds of a failure, but a rank that never joined the job (its peer failed before ``init()``)
would wait for the start timeout; it is reported as stopped instead, and its worker is ended.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._worker import Outcome

__all__ = ["GRACE_SECONDS", "LEAVE_SECONDS", "Callbacks", "call_with", "end_workers", "gather", "stopped_reason"]

GRACE_SECONDS = 10.0
LEAVE_SECONDS = 10.0  # how long workers get to leave the job together before they are ended
_TICK_SECONDS = 0.1


def call_with(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], executable: Any) -> Any:
    """``fn(*args, **kwargs)``, ignoring the worker's executable (the form ``run`` sends)."""
    return fn(*args, **kwargs)


def calling(fn: Callable[..., Any], args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> Callable[[Any], Any]:
    """A picklable one-argument function that calls ``fn(*args, **kwargs)``."""
    return functools.partial(call_with, fn, list(args or []), dict(kwargs or {}))


class Callbacks:
    """A Ray queue the workers' ``ray_logger.log`` fills, and the driver's callbacks that drain it."""

    def __init__(self, callbacks: Sequence[Callable[[Any], object]] | None) -> None:
        self.callbacks = list(callbacks or [])
        self.queue: Any = None
        if self.callbacks:
            from ray.util.queue import Queue

            self.queue = Queue(actor_options={"num_cpus": 0})

    def attach(self, workers: Sequence[Any]) -> None:
        """Hand the queue to `workers` (nothing without callbacks)."""
        if self.queue is not None:
            import ray

            ray.get([worker.set_queue.remote(self.queue) for worker in workers])

    def drain(self) -> None:
        """Call every callback with each value logged since the last drain, in order."""
        if self.queue is None:
            return
        while not self.queue.empty():
            item = self.queue.get_nowait()
            for callback in self.callbacks:
                callback(item)

    def close(self) -> None:
        if self.queue is not None:
            self.drain()
            self.queue.shutdown()
            self.queue = None


def gather(refs: Sequence[Any], names: Sequence[str], callbacks: Callbacks | None = None,
           grace_seconds: float = GRACE_SECONDS) -> list[Outcome]:
    """Every rank's `Outcome` of the calls `refs` (rank order); `names` says how to name each rank's worker.

    After the first failure, ranks still running `grace_seconds` later are reported as stopped.
    """
    import ray

    outcomes: dict[int, Outcome] = {}
    index = {ref: rank for rank, ref in enumerate(refs)}
    pending = list(refs)
    deadline = float("inf")
    first = ""
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_TICK_SECONDS)
        for ref in ready:
            rank = index[ref]
            outcomes[rank] = _outcome(ref, names[rank])
            if outcomes[rank].status == "failed" and deadline == float("inf"):
                deadline, first = time.monotonic() + grace_seconds, f"rank {rank}"
        if callbacks is not None:
            callbacks.drain()
        if pending and time.monotonic() > deadline:
            for ref in pending:
                rank = index[ref]
                outcomes[rank] = Outcome("failed", reason=stopped_reason(names[rank], grace_seconds, first))
            break
    return [outcomes[rank] for rank in range(len(refs))]


def stopped_reason(name: str, grace_seconds: float, first: str) -> str:
    """Why a rank still running `grace_seconds` after `first` failed is reported as failed. Pure.

    `name` is the rank's worker name as `gather` gets it, which already says the rank and its host.

    Example:
        >>> stopped_reason("rank 0 (vm)", 10.0, "rank 1")
        'rank 0 (vm) was stopped: still running 10 s after rank 1 failed'
    """
    return f"{name} was stopped: still running {grace_seconds:g} s after {first} failed"


def _outcome(ref: Any, name: str) -> Outcome:
    """A finished call's `Outcome`; a worker that died (or any error of Ray's) as a failure naming it."""
    import ray

    try:
        outcome: Outcome = ray.get(ref)
        return outcome
    except ray.exceptions.RayActorError as exc:
        return Outcome("failed", reason=f"{name}: its worker process ended ({_first_line(exc)})", cause=True)
    except ray.exceptions.RayError as exc:
        return Outcome("failed", reason=f"{name}: Ray could not run the call ({_first_line(exc)})", cause=True)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def end_workers(workers: Sequence[Any], leave: bool) -> None:
    """End `workers`; with `leave`, first let them leave the unison job together (so that no rank's
    transport sees its peers vanish mid-cycle), waiting `LEAVE_SECONDS` at most."""
    import ray

    if leave and workers:
        refs = [worker.leave.remote() for worker in workers]
        ray.wait(refs, num_returns=len(refs), timeout=LEAVE_SECONDS)
    for worker in workers:
        try:
            ray.kill(worker)
        except Exception:  # noqa: BLE001  (an actor already gone is what we want)
            pass
