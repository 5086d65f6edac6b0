"""A setting that a rank cannot parse inside ``init()``: unisonrun names that rank (or every rank that had it)
with its own error, not a rank that only learnt of it, and exits 2 (the job could not start)."""

from __future__ import annotations

import re

import pytest
from faults._jobs import BOUND_SECONDS, PYTHON, run_job, unisonrun

pytestmark = pytest.mark.timeout(120)

# The bad value comes from the program itself (after unisonrun's own check of the environment), on the
# ranks listed in the first argument; then init().
PROGRAM = ("import os, sys\n"
           "if os.environ.get('PMI_RANK') in sys.argv[1].split(','):\n"
           "    os.environ['UNISON_PEER_TIMEOUT_SECONDS'] = 'abc'\n"
           "import unison\n"
           "unison.init()\n"
           "print('started', unison.rank(), flush=True)\n")
ERROR = ("ConfigError: UNISON_PEER_TIMEOUT_SECONDS must be a non-negative number. "
         "Got UNISON_PEER_TIMEOUT_SECONDS='abc'.")


def _named(output: str) -> dict[int, str]:
    """unisonrun's closing lines, by the rank each names."""
    lines = [line for line in output.splitlines() if line.startswith("unisonrun:")]
    named = {}
    for line in lines:
        match = re.match(r"unisonrun: rank (\d+) \(", line)
        assert match is not None, output
        named[int(match.group(1))] = line
    assert len(named) == len(lines), output
    return named


def _could_not_start(rank: int) -> str:
    return rf"unisonrun: rank {rank} \([^,]+, pid \d+\) could not start: {re.escape(ERROR)}"


def test_a_setting_one_rank_cannot_parse_names_that_rank_alone() -> None:
    # Rank 0 fails too (StartupError: rank 1 could not start), usually first: a consequence, not named.
    done = run_job(unisonrun("-np", "2", PYTHON, "-c", PROGRAM, "1"))
    assert done.returncode == 2, done.output
    named = _named(done.output)
    assert list(named) == [1], done.output
    assert re.fullmatch(_could_not_start(1), named[1]), done.output
    assert f"StartupError: init() failed: rank 1 could not start: {ERROR.rstrip('.')}" in done.output
    assert "before unison.init()" not in done.output
    assert "started" not in done.output
    assert done.seconds < BOUND_SECONDS, done.seconds


@pytest.mark.parametrize("where", ["program", "mpi-args"])
def test_a_setting_no_rank_can_parse_names_every_rank(where: str) -> None:
    if where == "program":
        done = run_job(unisonrun("-np", "2", PYTHON, "-c", PROGRAM, "0,1"))
    else:  # past unisonrun's own check of the environment: straight into mpiexec's
        done = run_job(unisonrun("-np", "2", "--mpi-args", "-genv UNISON_PEER_TIMEOUT_SECONDS abc",
                                 PYTHON, "-c", PROGRAM, ""))
    assert done.returncode == 2, done.output
    named = _named(done.output)
    assert sorted(named) == [0, 1], done.output
    for rank, line in named.items():
        assert re.fullmatch(_could_not_start(rank), line), done.output
    assert "before unison.init()" not in done.output
    assert done.seconds < BOUND_SECONDS, done.seconds
