"""Decide whom to name when a job fails, from the ranks' marker files and the order in which they ended.

Markers in the launcher's directory, one file per rank and event: ``started-R`` (host and pid, written
by ``init()``), ``failed-R`` (the abort reason, from the exception hook), ``finished-R`` (an orderly
``shutdown()``), all from `unison._job.failure`; and ``ended-R`` (pid and exit code, negative for a
signal), written by the rank's keeper (`keeper`) as soon as the rank ended and before mpiexec learns
of it. `blame` is pure: the supervisor feeds it what it saw since its last look.

The rule: the first thing that went wrong is the cause and is named; ranks that end after it are its
consequence (mpiexec or the abort stops them) and are not. Uncaught exceptions (``failed-R``) are
always named. Markers are ordered by the time they were written, which for ``ended-R`` is before
mpiexec can stop any other rank; deaths seen only through `DeathWatch` (ranks without a keeper) come
after the markers of the same look. A rank whose own set-up fails in ``init()`` (a setting it cannot
parse) leaves ``failed-R`` (``rank R (...) could not start: ...``, `could_not_start`) before it tells the
others, so the ranks that fail only because it did are its consequence. A rank that shut unison down in order and then exited non-zero
(``sys.exit(4)``) is named with that status, unless its ``finished-R`` says a peer's exit stopped it
(an uncaught ``ShutdownError``: the peers a ``sys.exit(4)`` left waiting) or the status is
``HOSTS_UPDATED_EXIT`` (an elastic rank's stop for a host change).

A job can also fail with no failure to name: a rank runs out of data, leaves its loop and exits 0
without ``hvd.join()``, and the ranks still waiting in a collective raise ``ShutdownError`` (exit 1, a
peer's doing). `finished_early` names the ranks that finished and says what to do.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..._contract import FINISHED_AFTER_PEER, HOSTS_UPDATED_EXIT, parse_marker_name
from .reports import spoken_list

__all__ = ["Markers", "blame", "could_not_start", "finished_early", "read_markers"]

# The ``failed-R`` of a rank whose own set-up failed in init() (`unison._job.launch`'s ``check_start``).
_COULD_NOT_START = re.compile(r"rank \d+ \(.*, pid \d+\) could not start: ")


@dataclasses.dataclass
class Markers:
    """The marker files of one job directory at one moment."""

    started: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)  # rank -> (host, pid)
    failed: dict[int, str] = dataclasses.field(default_factory=dict)  # rank -> reason
    finished: set[int] = dataclasses.field(default_factory=set)
    after_peer: set[int] = dataclasses.field(default_factory=set)  # finished, then stopped by a peer's exit
    ended: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # rank -> (pid, exit code)
    written_ns: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)  # (kind, rank) -> mtime


def read_markers(directory: Path) -> Markers:
    """Read the markers in `directory` (an empty set if it is gone)."""
    markers = Markers()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return markers
    for entry in entries:
        marker = parse_marker_name(entry.name)
        if marker is None:
            continue
        kind, rank = marker
        try:
            markers.written_ns[(kind, rank)] = entry.stat().st_mtime_ns
            text = Path(entry.path).read_text(errors="backslashreplace").strip()
        except OSError:
            continue
        if kind == "finished":
            markers.finished.add(rank)
            if text == FINISHED_AFTER_PEER:
                markers.after_peer.add(rank)
        elif kind == "failed":
            markers.failed[rank] = text
        elif kind == "started":
            host, _, pid = text.partition(" ")
            if pid.isdigit():
                markers.started[rank] = (host, int(pid))
        else:
            pid, _, code = text.partition(" ")
            if pid.isdigit() and code.lstrip("-").isdigit():
                markers.ended[rank] = (int(pid), int(code))
    return markers


def could_not_start(why: str) -> bool:
    """Whether the failure `why` is a rank's own failure to start in ``init()`` (a bad setting, a file it cannot write).

    Example:
        >>> could_not_start("rank 1 (h, pid 11) could not start: ConfigError: X must be a number. Got X='abc'.")
        True
        >>> could_not_start("rank 0 (h, pid 10) failed: StartupError: init() failed: rank 1 could not start: X")
        False
    """
    return _COULD_NOT_START.match(why) is not None


def how_ended(code: int) -> str:
    """How a process with exit code `code` (``-N``: killed by signal N) ended, in words.

    Example:
        >>> how_ended(1), how_ended(-9), how_ended(-200)
        ('exited with status 1', 'killed by signal 9 (SIGKILL)', 'killed by signal 200')
    """
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"killed by signal {-code}"


def _ended(rank: int, code: int, pid: int, markers: Markers, host: str, role: str = "") -> str | None:
    """Why `rank`, which ended with `code`, failed; None if its end was no failure.

    `role` names ranks that never call ``unison.init()`` (parameter-server trainers) by what they are.
    """
    if rank in markers.finished:  # its own status, chosen after an orderly shutdown (sys.exit(4))
        if code in (0, HOSTS_UPDATED_EXIT) or rank in markers.after_peer:
            return None
        return f"rank {rank} ({markers.started.get(rank, (host, pid))[0]}, pid {pid}) {how_ended(code)} after " \
               "shutting unison down."
    if rank in markers.failed:
        return markers.failed[rank]
    where = f"rank {rank} ({markers.started.get(rank, (host, pid))[0]}, pid {pid})"
    if role and rank not in markers.started:
        return f"{role} {rank} ({host}, pid {pid}) {how_ended(code)}." if code != 0 else None
    if rank in markers.started:
        return f"{where} ended without shutting unison down ({how_ended(code)}) while the job was running."
    if code != 0:
        return f"{where} {how_ended(code)} before unison.init()."
    return None  # a program that never started unison and exited 0


def blame(markers: Markers, deaths: Sequence[Sequence[int]], known: Mapping[int, str],
          host: str, *, role: str = "", independent: bool = False) -> dict[int, str]:
    """Decide which ranks to name as failed, from what was seen since the last look; returns new entries.

    `markers` are all the marker files so far; `deaths` are groups of ranks of this `host` seen dead by
    `DeathWatch` since the last look, first death first (several in one group: order unknown); `known`
    holds the failures already named, first first. `role` names ranks that never call
    ``unison.init()`` (``"parameter-server trainer"``); `independent` says a failure stops no other
    rank (nothing is its consequence), so every one is named.

    Example:
        >>> seen = Markers(started={0: ("h", 10), 1: ("h", 11)}, ended={0: (10, -9), 1: (11, -9)},
        ...                written_ns={("ended", 0): 2, ("ended", 1): 1})
        >>> blame(seen, [[0], [1]], {}, "h")
        {1: 'rank 1 (h, pid 11) ended without shutting unison down (killed by signal 9 (SIGKILL)) while the job was running.'}
    """
    new: dict[int, str] = {}

    def first() -> bool:
        return independent or (not known and not new)

    events = [(written, kind, rank) for (kind, rank), written in markers.written_ns.items()
              if kind in ("failed", "ended") and rank not in known]
    for _, kind, rank in sorted(events):
        if rank in new:
            continue
        if kind == "failed":
            new[rank] = markers.failed[rank]
        elif first():
            pid, code = markers.ended[rank]
            why = _ended(rank, code, pid, markers, host, role)
            if why is not None:
                new[rank] = why
    for group in deaths:
        vanished = [r for r in sorted(group) if r not in markers.finished and r not in markers.failed
                    and r not in markers.ended and r not in known and r not in new]
        if vanished and first():
            names = ", ".join(f"rank {r} ({markers.started[r][0]}, pid {markers.started[r][1]})"
                              for r in vanished)
            new[vanished[0]] = (
                f"{names} ended without shutting unison down (killed by a signal, or os._exit) while "
                "the job was running" + ("; their order is unknown: mpiexec may have killed all but one "
                                         "of them." if len(vanished) > 1 else ".")
            )
    return new


def finished_early(markers: Markers, host: str = "") -> str | None:
    """Why a job failed that has no failure to name: ranks that finished while others waited in a collective.

    The waiting ranks are those whose ``finished-R`` says a peer's exit stopped them (an uncaught
    ``ShutdownError``) and that did not exit 0; the ranks that finished are those that shut unison
    down in order and exited 0 (a non-zero status is `blame`'s to name). None when either is missing.

    Example:
        >>> seen = Markers(started={0: ("h", 10), 1: ("h", 11)}, finished={0, 1}, after_peer={0},
        ...                ended={0: (10, 1), 1: (11, 0)})
        >>> print(finished_early(seen))
        rank 1 (h, pid 11) finished (exit status 0) while rank 0 still waited in a collective: a rank that runs out of data must call hvd.join() (or every rank must run the same collectives).
    """
    waiting = sorted(rank for rank in markers.after_peer if markers.ended.get(rank, (0, 1))[1] != 0)
    finished = sorted(rank for rank in markers.finished - markers.after_peer
                      if markers.ended.get(rank, (0, 0))[1] == 0)
    if not waiting or not finished:
        return None
    names = []
    for rank in finished:
        rank_host, pid = markers.started.get(rank, (host, markers.ended.get(rank, (0, 0))[0]))
        names.append(f"rank {rank} ({rank_host}, pid {pid})")
    named = spoken_list(names)
    status = " (exit status 0)" if all(rank in markers.ended for rank in finished) else ""
    who = ("rank " if len(waiting) == 1 else "ranks ") + spoken_list([str(rank) for rank in waiting])
    return (f"{named} finished{status} while {who} still waited in a collective: a rank that runs "
            "out of data must call hvd.join() (or every rank must run the same collectives).")
