"""Every rank of a unisonrun job gets the variables horovodrun gives its workers (HOROVOD_RANK, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison.launcher import run
from unison.launcher.supervision.keeper import horovod_variables

from . import _run_work

pytestmark = pytest.mark.timeout(120)

PYTHON = sys.executable
NAMES = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
         "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
# Each rank writes its HOROVOD_* variables (no unison needed: Horovod's scripts read them before init).
PROGRAM = """\
import json, os, sys
values = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
open(os.path.join(sys.argv[1], "rank-" + os.environ["HOROVOD_RANK"] + ".json"), "w").write(json.dumps(values))
"""


def _expected(host: str, rank: int, size: int, local: tuple[int, int], cross: tuple[int, int]) -> dict[str, str]:
    return dict(zip(NAMES, (host, str(rank), str(size), *map(str, local), *map(str, cross))))


def _launch(tmp_path: Path, *args: str) -> list[dict[str, str]]:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNISON_", "PMI_", "HOROVOD_"))}
    done = subprocess.run([PYTHON, "-m", "unison.launcher", *args, PYTHON, str(program), str(tmp_path)],
                          capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank-*.json"))]


def test_ranks_on_hosts_get_horovodruns_variables(tmp_path: Path) -> None:
    # Two names of this machine as two hosts; 3 ranks fill localhost's 2 slots, then 127.0.0.1's first.
    assert _launch(tmp_path, "-np", "3", "-H", "localhost:2,127.0.0.1:2") == [
        _expected("localhost", 0, 3, (0, 2), (0, 2)),
        _expected("localhost", 1, 3, (1, 2), (0, 1)),  # no other host runs a local rank 1
        _expected("127.0.0.1", 2, 3, (0, 1), (1, 2)),
    ]


def test_ranks_of_a_local_job_run_on_localhost_as_under_horovodrun(tmp_path: Path) -> None:
    assert _launch(tmp_path, "-np", "2") == [_expected("localhost", rank, 2, (rank, 2), (0, 1)) for rank in (0, 1)]


def test_ranks_of_an_elastic_job_are_named_by_their_elastic_host(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    found = _launch(tmp_path, "-np", "2", "--host-discovery-script", f"cat {tmp_path / 'hosts'}")
    assert found == [_expected("localhost", 0, 2, (0, 1), (0, 2)), _expected("127.0.0.1", 1, 2, (0, 1), (1, 2))]


def test_unison_run_gives_them_too() -> None:
    found = run(_run_work.horovod_variables, num_proc=2, timeout=90)
    assert [{k: v for k, v in values.items() if k in NAMES} for values in found] == [
        _expected("localhost", rank, 2, (rank, 2), (0, 1)) for rank in (0, 1)]


def test_unison_run_names_the_hosts_it_was_given() -> None:
    # As horovod.run(hosts=...): rank 0 on localhost's one slot, rank 1 on 127.0.0.1 (both this machine).
    found = run(_run_work.horovod_variables, num_proc=2, hosts="localhost:1,127.0.0.1:2", timeout=90)
    assert [{k: v for k, v in values.items() if k in NAMES} for values in found] == [
        _expected("localhost", 0, 2, (0, 1), (0, 2)), _expected("127.0.0.1", 1, 2, (0, 1), (1, 2))]


def test_without_a_host_list_mpiexecs_host_name_and_local_rank() -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_HOSTNAME": "n7"}
    assert horovod_variables(env) == _expected("n7", 1, 4, (1, 2), (0, 1))
    assert horovod_variables({"PMI_RANK": "0"}) == {}  # no size: not a rank of a launch
