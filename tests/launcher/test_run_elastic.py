"""unison.run with horovod.run's elastic arguments runs the function through the elastic driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from unison.errors import LaunchError
from unison.launcher import run

from . import _run_elastic_work

pytestmark = pytest.mark.timeout(180)


def _discovery(tmp_path: Path, text: str) -> str:
    hosts = tmp_path / "hosts"
    hosts.write_text(text)
    return f"cat {hosts}"


def test_elastic_function_returns_the_results_of_every_rank(tmp_path: Path) -> None:
    results = run(_run_elastic_work.elastic_steps, args=(4,), min_np=1, max_np=2,
                  host_discovery_script=_discovery(tmp_path, "localhost:2\n"), elastic_timeout=60, timeout=150)
    history = [(step, 2) for step in range(4)]
    assert results == [{"rank": rank, "size": 2, "total": 20.0, "history": history} for rank in range(2)]


def test_a_rank_that_raises_once_is_relaunched_from_the_last_commit(tmp_path: Path) -> None:
    # Two names of this machine, one slot each: rank 1's host is blacklisted after it raises, and the
    # job goes on with one rank from the commit of step 1.
    marker = tmp_path / "failed-once"
    results = run(_run_elastic_work.elastic_steps, args=(4, str(marker)), min_num_proc=1, max_num_proc=2,
                  host_discovery_script=_discovery(tmp_path, "localhost\n127.0.0.1\n"), slots=1,
                  elastic_timeout=60, timeout=150)
    assert marker.exists()
    assert results == [{"rank": 0, "size": 1, "total": 2.0 + 4.0 + 3.0 + 4.0,
                        "history": [(0, 2), (1, 2), (2, 1), (3, 1)]}]


def test_an_elastic_job_that_stops_raises_the_drivers_reason(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LaunchError, match=r"unison.run: the elastic job stopped with exit status 1; "
                       r"the elastic driver's reason is printed above"):
        run(_run_elastic_work.elastic_steps, args=(1,), min_np=3,
            host_discovery_script=_discovery(tmp_path, "localhost:2\n"), elastic_timeout=1, timeout=60)
    assert "waited 1 s (elastic_timeout) for hosts: 2 ranks available, 3 needed" in capfd.readouterr().err



def test_elastic_arguments_with_fixed_hosts_run_an_elastic_job_on_them(tmp_path: Path) -> None:
    # horovod.run(..., hosts=..., min_num_proc=...): no discovery script. Rank 1's host (127.0.0.1)
    # leaves after it raises, and the job goes on on localhost from the commit of step 1.
    marker = tmp_path / "failed-once"
    results = run(_run_elastic_work.elastic_steps, args=(4, str(marker)), hosts="localhost:1,127.0.0.1:1",
                  min_num_proc=1, max_num_proc=2, elastic_timeout=60, timeout=150)
    assert marker.exists()
    assert results == [{"rank": 0, "size": 1, "total": 2.0 + 4.0 + 3.0 + 4.0,
                        "history": [(0, 2), (1, 2), (2, 1), (3, 1)]}]
