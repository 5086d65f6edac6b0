"""What every test session shares: long files first, and the cleanup of what killed jobs left in /dev/shm.

Order. A file marked ``long_jobs`` (minutes of multi-process jobs in a few tests) is collected before
the others, keeping its place among them. ``make test`` runs its tiers under pytest-xdist with
``--dist loadfile --no-loadscope-reorder``: files go to the workers in that order, so the long ones
start first and the many short files fill the end, where xdist's own order (most tests first) left
the long files to run last on one worker while the other had nothing to do.

Cleanup. Fault tests stop plain ``mpiexec`` jobs with signals, and a rank killed that way never unlinks its
segments (``/dev/shm/mpich_shm_*``, 1-3 MB each; unisonrun removes its own ranks' segments, plain
mpiexec does not). At the end of the session the controlling process (not a pytest-xdist worker, not a
rank of a multi-rank run) unlinks the segments that appeared during the session, that no live
process maps and that are over 5 s old: only what the session's own jobs left, never a running job's.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

from unison.launcher.supervision.reaper import SEGMENT_PREFIX, mapped_segments, remove_segments

_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "RANK")
_BEFORE = pytest.StashKey[set[str]]()


def _controls(session: pytest.Session) -> bool:
    return not hasattr(session.config, "workerinput") and not any(name in os.environ for name in _RANK_VARIABLES)


def _segments() -> set[str]:
    return set(glob.glob(SEGMENT_PREFIX + "*"))


def _older_than(path: str, seconds: float) -> bool:
    try:
        return os.stat(path).st_mtime < time.time() - seconds
    except OSError:
        return False


def _mapped_by_anyone() -> set[str]:
    mapped: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            mapped |= mapped_segments(int(entry))
    return mapped


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long_jobs: a file of long multi-process jobs: scheduled before the others")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("long_jobs") is None)  # stable: files stay whole


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controls(session):
        session.stash[_BEFORE] = _segments()


def pytest_sessionfinish(session: pytest.Session) -> None:
    before = session.stash.get(_BEFORE, None)
    if before is None:
        return
    left = {path for path in _segments() - before if _older_than(path, 5.0)}  # not one a job is setting up
    if left:
        remove_segments(left - _mapped_by_anyone())
