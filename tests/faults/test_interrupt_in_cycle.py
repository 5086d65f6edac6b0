"""A SIGINT that reaches a rank while its main thread runs a cycle of the job waits for the cycle's end.

In the steady state a blocking call's cycle runs on the calling thread; a KeyboardInterrupt raised in
the middle of it would leave the peers in a cycle this rank never finishes (the engine must then stop,
and the job end by MPI_Abort without the rank's own report). The interrupt is held until the cycle ends,
so the rank fails with its own KeyboardInterrupt and the others are told, by name, through the job's
abort, as for an interrupt outside unison.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ._jobs import HERE, MPIEXEC, PYTHON, assert_no_strays, run_job

pytestmark = pytest.mark.timeout(180)


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} did not appear within {seconds} s")
        time.sleep(0.05)


@pytest.mark.parametrize("attempt", range(3))
def test_sigint_to_one_rank_in_a_steady_loop_is_its_own_keyboard_interrupt_and_named_on_the_other(
        tmp_path: Path, attempt: int) -> None:
    scenario = str(HERE / "_interrupt_scenario.py")
    result: dict[str, object] = {}

    def launch() -> None:
        result["done"] = run_job([MPIEXEC, "-n", "2", PYTHON, scenario, str(tmp_path)], deadline=90)

    runner = threading.Thread(target=launch)
    runner.start()
    _wait_for(tmp_path / "looping-0", 60)
    _wait_for(tmp_path / "looping-1", 60)
    time.sleep(0.2 + 0.1 * attempt)
    os.kill(int((tmp_path / "pid-0").read_text()), signal.SIGINT)
    runner.join(120)
    assert not runner.is_alive()
    done = result["done"]
    caught = {rank: (tmp_path / f"caught-{rank}").read_text() for rank in (0, 1)}
    assert caught[0].startswith("KeyboardInterrupt"), (caught, done.output[-3000:])  # type: ignore[attr-defined]
    assert "rank 0" in caught[1] and "KeyboardInterrupt" in caught[1], (caught, done.output[-3000:])  # type: ignore[attr-defined]
    assert "while it ran a cycle" not in done.output, done.output[-3000:]  # type: ignore[attr-defined]
    assert done.returncode != 0  # type: ignore[attr-defined]
    assert_no_strays(tmp_path, 2)
