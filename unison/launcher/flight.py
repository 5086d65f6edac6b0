"""Read the ranks' flight records side by side: ``python -m unison.launcher.flight DIR``.

Each rank of a job that stalled, deadlocked or lost a rank wrote the last collectives it submitted to
``DIR/flight-<rank>.json`` (`unison._job.flight_file`; unisonrun and rank 0 say where DIR is). Every
rank runs the collectives of a process set in the same order, so the collectives that ran line up
from the last one back; what follows on each rank, submitted and never run, is where the ranks
diverge. The reader shows the last collectives that ran on every rank, then each rank's own tail
(ranks with the same tail together), then the ranks that left no record.

Example::

    $ python -m unison.launcher.flight /tmp/unisonrun-flight-x1y2
    flight records of ranks [0, 1] (of 2), written 0.1 s apart; the job deadlocked
    the last 3 collectives every rank ran (oldest first):
      allreduce.grad.0  [4] float64  _scenario.py:66 in <module>
      ...
    where the ranks diverge, what each submitted and did not run:
      rank 0: allreduce.grad.3 [4] float64, pending 2.3 s, at _scenario.py:66 in <module>
      rank 1: allreduce.noname.1 [1] float64, pending 2.3 s, at _scenario.py:60 in <module>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._job.flight_file import FORMAT
from .._job.stop_report import stop_words

__all__ = ["Divergence", "diverge", "load", "main", "render"]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """What the records say together.

    Attributes:
        ran: the last collectives of the global process set that every recorded rank ran, in the order
            they ran, oldest first (the lowest rank's entries).
        tails: rank -> what it submitted and did not run, oldest first: where the ranks diverge.
    """

    ran: list[dict[str, Any]]
    tails: dict[int, list[dict[str, Any]]]


def load(directory: Path) -> dict[int, dict[str, Any]]:
    """Every readable record in `directory`: rank -> its record (files of another format left out)."""
    records: dict[int, dict[str, Any]] = {}
    for path in sorted(directory.glob("flight-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("rank"), int) \
                and isinstance(data.get("entries"), list):
            records[data["rank"]] = data
    return records


def _ran(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The entries that ran (done or failed), in the order they finished."""
    done = [entry for entry in entries if entry.get("state") in ("done", "failed")]
    return sorted(done, key=lambda entry: (entry.get("finished") or 0.0, str(entry.get("name"))))


def _key(entry: Mapping[str, Any]) -> tuple[object, ...]:
    return entry.get("name"), entry.get("kind"), tuple(entry.get("shape") or ()), entry.get("dtype")


def diverge(records: Mapping[int, Mapping[str, Any]]) -> Divergence:
    """Line up the ranks' records: the global set's collectives that ran, from the last one back while
    every rank's is the same call; then each rank's pending ones (pure; see the module docstring)."""
    ranks = sorted(records)
    if not ranks:
        return Divergence([], {})
    ran = {rank: [entry for entry in _ran(records[rank]["entries"]) if entry.get("set", 0) == 0] for rank in ranks}
    common = 0
    while all(common < len(ran[rank]) for rank in ranks) and \
            len({_key(ran[rank][-1 - common]) for rank in ranks}) == 1:
        common += 1
    first = ran[ranks[0]]
    tails = {rank: [dict(entry) for entry in records[rank]["entries"] if entry.get("state") == "pending"]
             for rank in ranks}
    return Divergence([dict(entry) for entry in first[len(first) - common:]], tails)


def _entry_text(entry: Mapping[str, Any], written: float | None) -> str:
    shape = "[" + ", ".join(str(d) for d in entry.get("shape") or ()) + "]"
    parts = [f"{entry.get('name')} {shape} {entry.get('dtype')}"]
    if entry.get("state") == "pending" and written is not None and entry.get("taken"):
        parts.append(f"pending {max(0.0, written - float(entry['taken'])):.1f} s")
    elif entry.get("state") == "failed":
        parts.append("failed")
    if entry.get("site"):
        parts.append(f"at {entry['site']}")
    return ", ".join(parts)


def render(records: Mapping[int, Mapping[str, Any]], last: int = 10) -> str:
    """The side-by-side report of `records` (`last`: how many common collectives to show)."""
    if not records:
        return "no flight records here (flight-<rank>.json of this unison version)."
    ranks = sorted(records)
    size = max(int(records[rank].get("size", 0)) for rank in ranks)
    written = [float(records[rank].get("written", 0.0)) for rank in ranks]
    reason = next((str(records[rank].get("reason")) for rank in ranks if records[rank].get("reason")), "")
    found = diverge(records)
    lines = [f"flight records of ranks {ranks} (of {size}), written {max(written) - min(written):.1f} s apart"
             + (f"; {stop_words(reason)[0]}" if reason else "")]
    shown = found.ran[-last:] if last > 0 else []
    if shown:
        lines.append(f"the last {len(shown)} collectives every rank ran (oldest first):")
        lines += [f"  {_entry_text(entry, None)}" for entry in shown]
    else:
        lines.append("no collective that ran lines up on every rank.")
    lines.append("where the ranks diverge, what each submitted and did not run:")
    by_tail: dict[tuple[tuple[object, ...], ...], list[int]] = {}
    for rank in ranks:
        by_tail.setdefault(tuple(_key(entry) for entry in found.tails[rank]), []).append(rank)
    for tail, together in by_tail.items():
        who = f"rank {together[0]}" if len(together) == 1 else f"ranks {together}"
        entries = found.tails[together[0]]
        stamp = float(records[together[0]].get("written", 0.0))
        if not tail:
            lines.append(f"  {who}: nothing")
            continue
        lines.append(f"  {who}: " + "; ".join(_entry_text(entry, stamp) for entry in entries[:6])
                     + (f"; ... and {len(entries) - 6} more" if len(entries) > 6 else ""))
    missing = [rank for rank in range(size) if rank not in records]
    if missing:
        lines.append(f"no record from ranks {missing}: they ended before the job stopped, or wrote it on "
                     "another host (UNISON_FLIGHT_DIR names one directory for every rank).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m unison.launcher.flight``."""
    parser = argparse.ArgumentParser(prog="python -m unison.launcher.flight", description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="where the ranks wrote flight-<rank>.json")
    parser.add_argument("--last", type=int, default=10, help="collectives every rank ran to show (default 10)")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"python -m unison.launcher.flight: {directory} is not a directory.", file=sys.stderr)
        return 2
    print(render(load(directory), args.last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
