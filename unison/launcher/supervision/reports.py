"""The launcher's closing report of the failures it named: one report per failure, the ranks of one error together.

An error that every rank of a collective raises with one message (a ``MismatchError``: two ranks
asked for different collectives under one name) reaches the launcher once per rank, each with the
rank's own call site. It is reported once, with each rank's call site on a line of its own, the odd
one out first: the ranks whose call site the fewest ranks share; among as many, the rank whose call
comes first in one function (in straight-line code, the extra call the other ranks went past;
within a loop that need not hold, and the lines say which call each rank made); then by rank. Every
other failure keeps its one line. Pure: `JobOutcome.summary` prints what `report_lines` returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..._job.stop_report import SHARED_ERRORS
from ..._job.summary import Reason, parse_reason

__all__ = ["odd_first", "report_lines"]

_SITE = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<function>\S+)$")


def _site(reason: Reason) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost user frame of `reason`, None without one."""
    match = _SITE.match(reason.where.split(" <- ")[0]) if reason.where else None
    return (match["file"], int(match["line"]), match["function"]) if match else None


def odd_first(reasons: Sequence[Reason]) -> list[Reason]:
    """The ranks of one shared error, in the order the report names them (see the module's rule).

    Example:
        >>> r = [Reason(0, "h", 10, "MismatchError", "m", "a.py:82 in main"),
        ...      Reason(1, "h", 11, "MismatchError", "m", "a.py:81 in main")]
        >>> [x.rank for x in odd_first(r)]
        [1, 0]
    """
    sites = {reason.rank: _site(reason) for reason in reasons}
    sharing = {rank: sum(1 for other in sites.values() if other == site) for rank, site in sites.items()}
    places = {(site[0], site[2]) for site in sites.values() if site is not None}
    one_function = len(places) == 1 and None not in sites.values()

    def key(reason: Reason) -> tuple[int, int, int]:
        site = sites[reason.rank]
        return sharing[reason.rank], site[1] if one_function and site is not None else 0, reason.rank

    return sorted(reasons, key=key)


def report_lines(failures: Mapping[int, str]) -> list[str]:
    """The launcher's lines for `failures` (rank -> why, first failure first), each prefixed ``unisonrun:``.

    Example:
        >>> lines = report_lines({
        ...     0: "rank 0 (h, pid 10) failed: MismatchError: shapes differ. at a.py:82 in main",
        ...     1: "rank 1 (h, pid 11) failed: MismatchError: shapes differ. at a.py:81 in main"})
        >>> print("\\n".join(lines))
        unisonrun: ranks 1 and 0 raised one MismatchError: shapes differ.
        unisonrun:   rank 1 (h, pid 11) at a.py:81 in main
        unisonrun:   rank 0 (h, pid 10) at a.py:82 in main
    """
    shared: dict[str, list[Reason]] = {}
    for why in failures.values():
        parsed = parse_reason(why)
        if parsed is not None and parsed.error in SHARED_ERRORS:
            shared.setdefault(parsed.message, []).append(parsed)
    lines: list[str] = []
    done: set[str] = set()
    for why in failures.values():
        parsed = parse_reason(why)
        group = shared.get(parsed.message, []) if parsed is not None else []
        if parsed is None or len(group) < 2:
            lines.append(f"unisonrun: {why}")
            continue
        if parsed.message in done:
            continue
        done.add(parsed.message)
        ordered = odd_first(group)
        ranks = [str(reason.rank) for reason in ordered]
        named = ", ".join(ranks[:-1]) + f" and {ranks[-1]}"
        text = parsed.message.removeprefix(f"{parsed.error}:").strip()
        lines.append(f"unisonrun: ranks {named} raised one {parsed.error}: {text}")
        lines += [f"unisonrun:   {reason.who}" + (f" at {reason.where}" if reason.where else "") for reason in ordered]
    return lines
