"""Re-form the job in place after a membership change: which failures call for it, and the steps of rejoining.

Under unisonrun's elastic driver a worker keeps its process across membership epochs (the elastic
launch, `unison._job.launch.elastic`). When an epoch ends, the ``run`` wrapper (`unison.elastic._state`)
tells the driver how it ended here (stopped at a commit for a change of hosts, or a collective
failed, naming the ranks found lost when the transport knows them), leaves the job locally without
the shutdown exchange (its peers are gone or re-forming) and calls ``init()``, which joins the next
epoch the driver forms. Under a driver that relaunches every process (an MPI launch per epoch) and
without a driver there is no worker: a failure propagates, as before.
"""

from __future__ import annotations

import re

from .._job.launch.elastic import ElasticWorker, current_worker
from ..errors import HorovodInternalError, MismatchError, MissingGradientError, NotInitializedError
from ._environment import environment

__all__ = ["lost_ranks", "rejoin", "resettable", "worker"]

# What the transports' liveness probes raise (`unison.backends.gloo`): "rank 3 stopped answering: ..."
# or "ranks [1, 3] stopped answering: ...".
_STOPPED_ANSWERING = re.compile(r"\branks? (?:(\d+)|\[([\d, ]+)\]) stopped answering")
# Errors that say the program is wrong, not that a peer was lost: a new epoch would fail the same way.
_PROGRAM_ERRORS = (MismatchError, MissingGradientError)


def worker() -> ElasticWorker | None:
    """This process's elastic worker, None when it is not one (no driver, or one launch per epoch)."""
    return current_worker()


def resettable(exc: BaseException, current: ElasticWorker) -> bool:
    """Whether `exc`, raised inside ``hvd.elastic.run``, ends the epoch rather than the process.

    Any error once the driver ended the epoch (a framework may wrap unison's error in its own type);
    before that, a `HorovodInternalError` other than a program's own mistake (a mismatch between
    ranks, a missing gradient), raised here or stopping the job's engine.
    """
    if current.ended(current.epoch):
        return True
    if isinstance(exc, HorovodInternalError):
        return not isinstance(exc, _PROGRAM_ERRORS)
    stop = _engine_stop()
    return isinstance(stop, HorovodInternalError) and not isinstance(stop, _PROGRAM_ERRORS)


def _engine_stop() -> BaseException | None:
    """The error the job's engine stopped with (None while it runs, or without a job)."""
    from .._job import runtime

    try:
        return runtime.job().engine.stop_error
    except NotInitializedError:
        return None


def lost_ranks(exc: BaseException) -> tuple[int, ...]:
    """The ranks a liveness probe found lost, as its error (or an error in its causes) names them; () if none.

    Example:
        >>> lost_ranks(RuntimeError("ranks [1, 3] stopped answering: rank 0 waited 12 s ..."))
        (1, 3)
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        match = _STOPPED_ANSWERING.search(str(error))
        if match:
            text = match.group(1) or match.group(2)
            return tuple(int(r) for r in text.replace(",", " ").split())
        error = error.__cause__ or error.__context__
    stop = _engine_stop()
    return lost_ranks(stop) if stop is not None and stop is not exc and id(stop) not in seen else ()


def rejoin() -> None:
    """Leave this epoch locally and join the next one the driver forms (``SystemExit(0)`` when it has no place)."""
    from .._job import runtime

    runtime.leave_job()
    environment.cache_clear()
    try:
        runtime.init()
    finally:
        environment.cache_clear()
