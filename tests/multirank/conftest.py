"""The multi-rank suite runs in lockstep under `unison.testing.pytest_plugin`, at 1, 2 and 3 ranks.

``python tests/run_multirank.py -n N`` runs it as N real processes under ``mpiexec``; the plugin puts
a named barrier with a timeout around every test (see docs/testing.md). Every case runs at every
size, the framework adapters' included (at one rank an allreduce is the identity and a
DistributedOptimizer is the plain optimizer), except those marked ``min_ranks(n)`` below n ranks and
the convergence tests outside the 2-rank MPI-controller suite.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["unison.testing.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "convergence: trains to an optimum (adapter numerics); runs in the 2-rank MPI suite only"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from unison.testing.pytest_plugin import world_size

    size = world_size(config)
    reason = ""
    if os.environ.get("UNISON_CONTROLLER", "").lower() == "grpc" or "TORCHELASTIC_RUN_ID" in os.environ:
        # The grpc and torchrun runs exist to exercise the control plane; long training runs that check an
        # adapter's numerics already ran over MPI and would only double the suite's time.
        reason = "convergence tests run in the MPI-controller suite"
    elif size > 2:
        # How many steps a compressed optimizer needs does not depend on the number of ranks,
        # and three ranks on a 2-core machine made these tests 80% of the 3-rank run. What does
        # depend on it (sizes, splits, bytes each scheme sends) is tested at 3 ranks without them.
        reason = "convergence tests run in the 2-rank suite"
    elif size == 1:
        # They check that replicas stay identical (or close) while training on different shards.
        reason = "convergence tests run in the 2-rank suite: one rank has no replicas to keep together"
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker("convergence"):
                item.add_marker(skip)
