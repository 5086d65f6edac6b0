"""Checks on tensor names that span several pending collectives: one name under two kinds, unnamed calls out of step.

Pure functions over plain data, called by the `Coordinator`. Names are ``<kind>.<user name>`` (for
example ``allreduce.grad``, ``grouped_allreduce.layer_1of3``), and unnamed collectives are
``<kind>.noname.<n>`` in the global set and ``<kind>.noname.set<id>.<n>`` in set <id>, where n
counts one rank's unnamed calls in that process set (see `unison._job.submit`). Two facts make the checks exact rather than heuristic:

- Horovod keys a collective by its user name alone, so an allreduce on one rank and a broadcast on
  another under the same name is a mismatch, reported once every member has asked for one of them.
- A rank's unnamed counter only grows. If rank a waits in unnamed call i and rank b, which never
  asked for i, already waits in a later call j > i, then b has passed i for good: the ranks are out
  of step and would otherwise wait for each other until the stall shutdown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["kind_conflict", "split_name", "unnamed_drift", "unnamed_index"]

_UNNAMED = re.compile(r"noname\.(?:set\d+\.)?(\d+)(?:_\d+of\d+)?")


def split_name(name: str) -> tuple[str, str]:
    """``(kind, user name)`` of a tensor name.

    Example:
        >>> split_name("allreduce.layer.0.weight")
        ('allreduce', 'layer.0.weight')
    """
    kind, _, rest = name.partition(".")
    return kind, rest


def unnamed_index(rest: str) -> int | None:
    """The call number n of an unnamed collective's user part ``noname.<n>`` (or
    ``noname.set<id>.<n>``), else None.

    Example:
        >>> unnamed_index("noname.12_2of3"), unnamed_index("noname.set2.7"), unnamed_index("grad")
        (12, 7, None)
    """
    match = _UNNAMED.fullmatch(rest)
    return int(match.group(1)) if match else None


def _ranks_text(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {ordered}"


def _ranks_list(ranks: Iterable[int]) -> str:
    """'rank [2]' / 'ranks [0, 1]', as every other mismatch message writes them."""
    ordered = sorted(ranks)
    return f"{'rank' if len(ordered) == 1 else 'ranks'} {ordered}"


def kind_conflict(rest: str, submitted: Mapping[str, frozenset[int]], expected: frozenset[int]) -> str:
    """The error text when ranks asked for different collectives under one user name, else ''.

    Args:
        rest: the user name shared by the pending names.
        submitted: kind -> ranks that asked for that kind under `rest` (two kinds or more).
        expected: the ranks that must take part.

    Only once every expected rank has asked for one of them: until then a rank may still ask for
    the other kind too (ranks may submit in different orders).

    Example:
        >>> kind_conflict("x", {"allreduce": frozenset({0}), "broadcast": frozenset({1})}, frozenset({0, 1}))
        "Mismatched operations for 'x': ALLREDUCE on rank [0]; BROADCAST on rank [1]. Every rank must submit the same collective under one name."
    """
    if len(submitted) < 2:
        return ""
    everyone: set[int] = set()
    for ranks in submitted.values():
        everyone |= ranks
    if not expected <= everyone:
        return ""
    label = _unnamed_label(rest)
    parts = "; ".join(f"{kind.upper()} on {_ranks_list(ranks)}"
                      for kind, ranks in sorted(submitted.items(), key=lambda item: min(item[1])))
    return (f"Mismatched operations for {label}: {parts}. Every rank must submit the same collective "
            "under one name.")


def _unnamed_label(rest: str) -> str:
    index = unnamed_index(rest)
    return f"unnamed collective #{index}" if index is not None else f"'{rest}'"


def unnamed_drift(pending: Sequence[tuple[int, str, frozenset[int]]], set_id: int) -> str:
    """The error text when unnamed collectives of one process set are out of step, else ''.

    Args:
        pending: (call number, kind, ranks that asked) for each pending unnamed collective of the set.
        set_id: the process set, for the message.

    Example:
        >>> unnamed_drift([(5, "allreduce", frozenset({1})), (6, "allreduce", frozenset({0}))], 0)[:85]
        'Unnamed collectives are out of step: rank 0 is at unnamed allreduce #6, rank 1 at #5.'
    """
    if len(pending) < 2:
        return ""
    ordered = sorted(pending, key=lambda item: item[0])
    passed = False
    later: set[int] = set()
    for _index, _, ranks in reversed(ordered):
        if later - ranks:
            passed = True
            break
        later |= ranks
    if not passed:
        return ""
    # Where each rank is: the highest unnamed call it waits in.
    position: dict[int, tuple[int, str]] = {}
    for index, kind, ranks in ordered:
        for rank in ranks:
            position[rank] = (index, kind)
    by_place: dict[tuple[int, str], list[int]] = {}
    for rank, place in sorted(position.items()):
        by_place.setdefault(place, []).append(rank)
    places = sorted(by_place.items(), key=lambda item: item[1][0])
    first_kind = places[0][0][1]
    described = []
    for number, ((index, kind), at_place) in enumerate(places):
        where = f"#{index}" if number and kind == first_kind else f"unnamed {kind} #{index}"
        verb = "" if number else " is" if len(at_place) == 1 else " are"
        described.append(f"{_ranks_text(at_place)}{verb} at {where}")
    where_set = "" if set_id == 0 else f" in process set {set_id}"
    return (
        f"Unnamed collectives are out of step{where_set}: {', '.join(described)}. Unnamed collectives "
        "are paired by their order on each rank, so every rank must make the same unnamed calls in "
        "the same order; a rank that skipped one (an exception caught before the call, a branch "
        "taken on some ranks only, uneven data before join()) never catches up. Give the "
        "collectives names (name=..., the same on every rank) or make every rank take the same path."
    )
