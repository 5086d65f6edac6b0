"""The launcher's closing report of the failures it named: one report per failure, the ranks of one error together.

An error that every rank of a collective raises with one message (a ``MismatchError``: two ranks
asked for different collectives under one name) reaches the launcher once per rank, each with the
rank's own call site. It is reported once, with each rank's call site on a line of its own, the odd
one out first (`unison._job.stop_report.odd_order`: the ranks whose call site the fewest ranks share;
among as many, the rank whose call comes first in one function; then by rank). Every other failure
keeps its one line. Pure: `JobOutcome.summary` prints what `report_lines` returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._job.stop_report import SHARED_ERRORS, odd_order
from ..._job.summary import Reason, parse_reason

__all__ = ["odd_first", "report_lines", "spoken_list"]


def spoken_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``.

    Example:
        >>> spoken_list(["0"]), spoken_list(["0", "3"]), spoken_list(["0", "3", "4"])
        ('0', '0 and 3', '0, 3 and 4')
    """
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def odd_first(reasons: Sequence[Reason]) -> list[Reason]:
    """The ranks of one shared error, in the order the report names them (`odd_order` of their sites).

    Example:
        >>> r = [Reason(0, "h", 10, "MismatchError", "m", "a.py:82 in main"),
        ...      Reason(1, "h", 11, "MismatchError", "m", "a.py:81 in main")]
        >>> [x.rank for x in odd_first(r)]
        [1, 0]
    """
    by_rank = {reason.rank: reason for reason in reasons}
    return [by_rank[rank] for rank in odd_order({reason.rank: reason.where for reason in reasons})]


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
        named = spoken_list([str(reason.rank) for reason in ordered])
        text = parsed.message.removeprefix(f"{parsed.error}:").strip()
        lines.append(f"unisonrun: ranks {named} raised one {parsed.error}: {text}")
        lines += [f"unisonrun:   {reason.who}" + (f" at {reason.where}" if reason.where else "") for reason in ordered]
    return lines
