"""Run the multi-rank test suite (tests/multirank) as N ranks under mpiexec and report each rank's outcome.

Usage: python tests/run_multirank.py -n N [--job-timeout SECONDS] [pytest args...]

The same as ``python -m unison.testing.run -n N tests/multirank [pytest args...]`` from the
repository's root (see docs/testing.md), or only the test files and ids given among the pytest args
(``tests/multirank/test_errors.py::test_shape_mismatch``). -n 1 runs every case at size 1, skipping
those that need more ranks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from unison.testing.run import main

ROOT = Path(__file__).resolve().parent.parent


def _names_tests(arg: str) -> bool:
    return not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists()


if __name__ == "__main__":
    os.chdir(ROOT)
    args = sys.argv[1:]
    sys.exit(main(args if any(_names_tests(arg) for arg in args) else ["tests/multirank", *args]))
