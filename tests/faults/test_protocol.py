"""A negotiation payload rank 0 cannot read stops every rank with the cause, instead of killing rank 0's engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._jobs import BOUND_SECONDS, MPIEXEC, PYTHON, assert_no_strays, run_job

pytestmark = pytest.mark.timeout(90)
SCENARIO = str(Path(__file__).resolve().parent / "_garbage_scenario.py")


@pytest.mark.parametrize("controller", ["mpi", "grpc"])
@pytest.mark.parametrize(("mode", "cause"), [("json", "JSONDecodeError"), ("kind", "no-such-kind")])
def test_unreadable_payload_aborts_every_rank_with_the_cause(tmp_path: Path, mode: str, cause: str,
                                                             controller: str) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), mode],
                   env={"UNISON_CONTROLLER": controller})
    assert done.returncode != 0, done.output
    for rank in (0, 1):
        caught = (tmp_path / f"caught-{rank}").read_text()
        assert caught.startswith("AbortedError: unison stopped the job: rank 1 sent a negotiation message "
                                 "that rank 0 cannot read"), caught
        assert cause in caught, caught
    assert done.seconds < BOUND_SECONDS, done.seconds
    assert_no_strays(tmp_path, 2)
