"""Run the multi-rank tests in lockstep: a named barrier with a timeout before and after every test.

The suite runs as N real processes under ``mpiexec`` (``python tests/run_multirank.py -n N``), each
rank collecting and running the same tests in the same order. Around every test each rank reports
which test it is at; if the ranks disagree the test fails with a message saying which rank is where,
and if some rank does not arrive within ``UNISON_TEST_BARRIER_SECONDS`` (60 s) the job is aborted
with a message naming the missing ranks and the test. Module- and session-scoped fixtures run
outside these barriers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import _harness
import pytest
from mpi4py import MPI

_NEEDS_MPIEXEC = (
    "multi-rank tests need more than one process; run them with "
    "`python tests/run_multirank.py -n 2` (or mpiexec -n 2 python -m pytest tests/multirank)"
)
_barrier_seconds = _harness.DEFAULT_BARRIER_SECONDS
_own_basetemp: str | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _barrier_seconds, _own_basetemp
    try:
        _barrier_seconds = _harness.barrier_seconds(os.environ)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    # pytest-timeout's default (SIGALRM) cannot interrupt a hang inside an MPI call, which never
    # returns to Python; the thread method dumps every stack and ends the process instead, and
    # mpiexec then ends the other ranks.
    if (
        config.pluginmanager.hasplugin("timeout")
        and config.getoption("timeout_method") is None
        and not config.getini("timeout_method")
    ):
        config.option.timeout_method = "thread"
    config.addinivalue_line(
        "markers", "convergence: trains to an optimum (adapter numerics); runs in the 2-rank MPI suite only"
    )
    if MPI.COMM_WORLD.Get_size() > 1:
        _harness.start(MPI.COMM_WORLD)
        if config.option.basetemp is None:
            # Ranks sharing pytest's default base directory delete each other's old directories.
            rank = MPI.COMM_WORLD.Get_rank()
            _own_basetemp = tempfile.mkdtemp(prefix=f"unison-multirank-rank{rank}-")
            config.option.basetemp = _own_basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _own_basetemp is not None and exitstatus == 0:
        shutil.rmtree(_own_basetemp, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    size = MPI.COMM_WORLD.Get_size()
    if size > 1:
        reason = ""
        if os.environ.get("UNISON_CONTROLLER", "").lower() == "grpc":
            # The grpc runs exist to exercise the control plane; long training runs that check an
            # adapter's numerics already ran over MPI and would only double the suite's time.
            reason = "convergence tests run in the MPI-controller suite"
        elif size > 2:
            # How many steps a compressed optimizer needs does not depend on the number of ranks,
            # and three ranks on a 2-core machine made these tests 80% of the 3-rank run. What does
            # depend on it (sizes, splits, bytes each scheme sends) is tested at 3 ranks without them.
            reason = "convergence tests run in the 2-rank suite"
        if reason:
            skip = pytest.mark.skip(reason=reason)
            for item in items:
                if item.get_closest_marker("convergence"):
                    item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason=_NEEDS_MPIEXEC)
    for item in items:
        item.add_marker(skip)


def _meet(request: pytest.FixtureRequest, name: str) -> None:
    barrier = _harness.current()
    if barrier is None:
        return
    try:
        names = barrier.wait(name, _barrier_seconds)
    except _harness.BarrierTimeout as timeout:
        # Stop capturing so the message reaches this rank's real stderr before the job ends.
        capture = request.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        barrier.abort(str(timeout), timeout.missing_ranks)
        raise
    mismatch = _harness.describe_mismatch(names)
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
def world() -> tuple[int, int]:
    """Return (rank, size) of this process in MPI.COMM_WORLD."""
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size()
