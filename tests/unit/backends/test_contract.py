"""The Backend contract (tests/backend_contract.py) on the in-process transports: loopback, and threads as ranks.

MPI and gRPC run the same checks under mpiexec: tests/multirank/test_backend_contract.py.
"""

from __future__ import annotations

import threading

import pytest

from tests.backend_contract import CHECKS, check_all
from unison.backends import create_backend
from unison.backends.loopback import ThreadGroup
from unison.config import load_settings


def test_loopback_keeps_the_contract() -> None:
    check_all(create_backend("loopback", None, load_settings({})))


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_threads_as_ranks_keep_the_contract(size: int, check) -> None:  # type: ignore[no-untyped-def]
    group = ThreadGroup(size)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            check(group.backend(r))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
            group.abandon()  # release the ranks waiting for this one

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a rank hung"
    if errors:
        raise errors[0]


def test_the_contract_catches_a_backend_that_does_not_reduce() -> None:
    from unison.backends.loopback import ThreadBackend

    class Lazy(ThreadBackend):
        def allreduce_(self, buf, op, process_set_id, after_chunk=None):  # type: ignore[no-untyped-def]
            return None  # keeps the local values

    group = ThreadGroup(2)
    failures: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            CHECKS[1](Lazy(group, r))  # check_allreduce
        except AssertionError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(failures) == 2
