"""A rank that fails in or before init() stops the job within the start-up bound, named, instead of hanging the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._jobs import MPIEXEC, PYTHON, assert_no_strays, run_job

pytestmark = pytest.mark.timeout(90)
SCENARIO = str(Path(__file__).resolve().parent / "_startup_scenario.py")
START_TIMEOUT = "3"
ENV = {"UNISON_START_TIMEOUT_SECONDS": START_TIMEOUT}


def _caught(directory: Path, rank: int) -> str:
    return (directory / f"caught-{rank}").read_text()


def test_rank_raising_before_init(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "raise"], env=ENV)
    assert done.returncode != 0, done.output
    assert "ValueError: injected failure before init()" in done.output
    assert "unison: rank 0 (" in done.output, done.output
    assert (f"waited {START_TIMEOUT} s in MPI's start-up for the other processes of the launch (2 in all)"
            in done.output), done.output
    assert done.seconds < 20, done.seconds
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize(
    ("mode", "failing", "error"),
    [
        ("setting", 1, "ConfigError: UNISON_CYCLE_TIME must be"),  # a setting only rank 1 cannot parse
        ("timeline", 0, "ConfigError: The timeline file"),  # only rank 0 opens the timeline
        ("autotune_log", 0, "ConfigError: UNISON_AUTOTUNE_LOG must name a file"),  # nor the autotune log
    ],
)
def test_local_set_up_that_fails_on_one_rank_only(tmp_path: Path, mode: str, failing: int, error: str) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), mode], env=ENV)
    assert done.returncode != 0, done.output
    assert _caught(tmp_path, failing).startswith(error)
    assert _caught(tmp_path, 1 - failing).startswith(
        f"StartupError: init() failed: rank {failing} could not start: {error}")
    assert done.seconds < 10, done.seconds
    assert_no_strays(tmp_path, 2)


def test_init_again_after_a_peer_left(tmp_path: Path) -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, SCENARIO, str(tmp_path), "reinit"], env=ENV)
    assert done.returncode != 0, done.output
    assert _caught(tmp_path, 0).startswith(
        f"StartupError: init() failed: rank 1 did not reach init() within {START_TIMEOUT} s")
    assert done.seconds < 25, done.seconds
    assert_no_strays(tmp_path, 2)
