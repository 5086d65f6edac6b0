"""Run a pytest suite as the ranks of an MPI job, in lockstep: a named barrier with a timeout around every test.

Load it with ``-p`` and start pytest under ``mpiexec``, one pytest per rank::

    mpiexec -n 2 python -m pytest -p unison.testing.pytest_plugin tests/mpi
    python -m unison.testing.run -n 2 tests/mpi        # the same, with one log per rank

Every rank collects and runs the same tests in the same order. Before and after each test every rank
reports which test it is at:

- if the ranks disagree (a skip, a collection error or a parametrization that differs between ranks),
  the test fails on every rank with a message saying which rank is where, and the session stops;
- if some rank does not arrive within ``UNISON_TEST_BARRIER_SECONDS`` (60 s by default), because it
  failed in a collective its peers are still waiting in or hangs, the job is aborted with a message
  naming the missing ranks and the test, and the missing ranks on this host dump their stacks;
- at the end of the session the ranks meet once more, so a rank that ran out of tests early (it
  collected fewer) is named instead of leaving the others waiting.

Module- and session-scoped fixtures run outside these barriers. At size 1 (plain ``pytest``, or
``mpiexec -n 1``) there is nothing to wait for and tests run as usual, except those marked
``@pytest.mark.min_ranks(n)``, which are skipped with a reason below ``n`` ranks. The plugin also

- gives each rank its own ``tmp_path`` base directory (ranks sharing pytest's default one delete each
  other's directories), removed after a session that passed;
- runs pytest-timeout, when installed, with its ``thread`` method: the default (SIGALRM) cannot
  interrupt a hang inside an MPI call, while the thread method dumps every stack and ends the process,
  and ``mpiexec`` then ends the other ranks;
- provides the ``world`` fixture: ``(rank, size)`` of ``MPI.COMM_WORLD``.

Under torchrun (torch's env:// variables, no MPI launcher) the ranks meet over torch's store instead
of MPI, with the same messages; a rank that times out ends itself and torchrun stops the others::

    torchrun --standalone --nproc-per-node 2 -m pytest -p unison.testing.pytest_plugin tests/mpi
    python -m unison.testing.run --torchrun -n 2 tests/mpi   # the same, with one log per rank

Example (``test_sum.py``, run with ``mpiexec -n 2 python -m pytest -p unison.testing.pytest_plugin
test_sum.py``)::

    import numpy as np
    import pytest
    import unison as hvd

    @pytest.fixture(scope="module", autouse=True)
    def job():
        hvd.init()
        yield
        hvd.shutdown()

    def test_sum_of_ranks(world):
        rank, size = world
        assert hvd.allreduce(np.array([rank]), op=hvd.Sum, name="ranks")[0] == sum(range(size))

    @pytest.mark.min_ranks(2)
    def test_each_rank_gets_its_own_row():
        ...

See ``docs/testing.md``.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import pytest

from . import _barrier

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["pytest_collection_modifyitems", "pytest_configure", "pytest_sessionfinish", "world", "world_size"]

_STATE = pytest.StashKey["_State"]()


class _State:
    """What the plugin keeps for one pytest session on one rank."""

    def __init__(self, rank: int, size: int, barrier: _barrier.NamedBarrier | _barrier.StoreBarrier | None,
                 barrier_seconds: float) -> None:
        self.rank, self.size, self.barrier = rank, size, barrier
        self.barrier_seconds = barrier_seconds
        self.own_basetemp: str | None = None
        self.dumps: IO[str] | None = None


def _join(barrier_seconds: float) -> _State:
    """This rank's place and barrier: over torch's store in a job torchrun started, else over MPI.

    Collective, and without a timeout: every rank builds it while configuring pytest.
    """
    on_store = _barrier.torch_store_barrier(os.environ)
    if on_store is not None:
        return _State(on_store.rank, on_store.size, on_store, barrier_seconds)
    comm = _import_mpi().COMM_WORLD
    size = comm.Get_size()
    return _State(comm.Get_rank(), size, _barrier.NamedBarrier(comm) if size > 1 else None, barrier_seconds)


def world_size(config: pytest.Config) -> int:
    """The number of ranks running this session (for a conftest deciding what runs where)."""
    return config.stash[_STATE].size


def _import_mpi() -> ModuleType:  # mpi4py.MPI
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise pytest.UsageError(
            "unison.testing.pytest_plugin needs mpi4py. Install it with `pip install mpi4py mpich` (the `mpi` extra) "
            f"(brings mpi4py and the mpich wheel with mpiexec). ({exc})"
        ) from None
    return MPI


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Join the job's ranks: build the named barrier, a base directory per rank, the stack dumps."""
    config.addinivalue_line(
        "markers",
        "min_ranks(n): the test needs at least n ranks; below that it is skipped with the reason",
    )
    try:
        seconds = _barrier.barrier_seconds(os.environ)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if (
        config.pluginmanager.hasplugin("timeout")
        and config.getoption("timeout_method", None) is None
        and not config.getini("timeout_method")
    ):
        config.option.timeout_method = "thread"
    state = _join(seconds)
    config.stash[_STATE] = state
    if state.size == 1:
        return
    if config.option.basetemp is None:
        state.own_basetemp = tempfile.mkdtemp(prefix=f"pytest-rank{state.rank}-")
        config.option.basetemp = state.own_basetemp
    # A rank whose barrier timed out sends SIGUSR1 to the missing ranks; mpiexec forwards SIGTERM
    # when a job is ended. Either way the stacks say where each rank was. The dumps go to a
    # descriptor of their own (pytest has not started capturing yet), so they reach the real
    # stderr even from the middle of a captured test. It stays open until exit: faulthandler
    # writes to it from a signal handler.
    state.dumps = os.fdopen(os.dup(sys.stderr.fileno()), "w")
    atexit.register(state.dumps.close)
    faulthandler.register(signal.SIGUSR1, file=state.dumps, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=state.dumps, all_threads=True, chain=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``min_ranks(n)`` when the job has fewer than n ranks."""
    size = config.stash[_STATE].size
    for item in items:
        marker = item.get_closest_marker("min_ranks")
        if marker is None:
            continue
        needed = marker.args[0] if marker.args else marker.kwargs.get("n")
        if not isinstance(needed, int) or needed < 1:
            raise pytest.UsageError(
                f"min_ranks takes a positive number of ranks, as in @pytest.mark.min_ranks(2). "
                f"Got {marker} on {item.nodeid}."
            )
        if size < needed:
            item.add_marker(pytest.mark.skip(
                reason=f"needs at least {needed} ranks; this job has {size} "
                f"(run it under mpiexec -n {needed}, or python -m unison.testing.run -n {needed})"
            ))  # fmt: skip


def _stop_capturing(config: pytest.Config) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)


def _report(config: pytest.Config, message: str) -> None:
    """Write ``message`` to this rank's real stderr (the test tool's own output, not a log line)."""
    _stop_capturing(config)
    print(message, file=sys.stderr, flush=True)


def _abort(config: pytest.Config, barrier: _barrier.NamedBarrier | _barrier.StoreBarrier,
           timeout: _barrier.BarrierTimeout) -> None:
    # The job ends before pytest's summary: this rank's failures so far are its likeliest cause.
    reporter = config.pluginmanager.getplugin("terminalreporter")
    for report in [] if reporter is None else reporter.stats.get("failed", []):
        _report(config, f"\nrank {barrier.rank}: {report.nodeid} failed ({report.when}):\n{report.longreprtext}")
    # Stop capturing so the message reaches this rank's real stderr before the job ends.
    _stop_capturing(config)
    barrier.abort(str(timeout), timeout.missing_ranks)


def _meet(request: pytest.FixtureRequest, name: str) -> None:
    state = request.config.stash[_STATE]
    if state.barrier is None:
        return
    try:
        names = state.barrier.wait(name, state.barrier_seconds)
    except _barrier.BarrierTimeout as timeout:
        _abort(request.config, state.barrier, timeout)
        raise
    mismatch = _barrier.describe_mismatch(names)
    if mismatch is not None:
        # Every rank saw the same names, so every rank stops here and the job ends together.
        request.session.shouldstop = mismatch
        pytest.fail(mismatch, pytrace=False)


@pytest.fixture(autouse=True)
def _lockstep(request: pytest.FixtureRequest) -> Iterator[None]:
    """Meet every other rank before and after each test."""
    _meet(request, f"the start of {request.node.nodeid}")
    yield
    _meet(request, f"the end of {request.node.nodeid}")


@pytest.fixture
def world(request: pytest.FixtureRequest) -> tuple[int, int]:
    """Return ``(rank, size)`` of this process in the job (``MPI.COMM_WORLD``, or torchrun's)."""
    state = request.config.stash[_STATE]
    return state.rank, state.size


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Meet every other rank at the end of the session; fail it if some rank is still elsewhere."""
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    barrier = state.barrier
    if barrier is not None:
        # A rank that ran out of tests early arrives here while the others are still at a test's
        # barrier: they see the mismatch, stop their sessions and arrive here a round later.
        for _ in range(barrier.size + 1):
            try:
                names = barrier.wait(_barrier.END_OF_SESSION, state.barrier_seconds)
            except _barrier.BarrierTimeout as timeout:
                _abort(session.config, barrier, timeout)
                raise
            mismatch = _barrier.describe_mismatch(names)
            if mismatch is None:
                break
            _report(session.config, f"\nrank {barrier.rank}: {mismatch}")
            if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if state.own_basetemp is not None and session.exitstatus == pytest.ExitCode.OK:
        shutil.rmtree(state.own_basetemp, ignore_errors=True)
