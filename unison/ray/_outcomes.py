"""Read how a call ended on every rank: the values in rank order, or a message naming each rank that failed (pure).

A rank's failure is a *cause* when it failed on its own account (its program raised, its process
died) and a *consequence* when it is unison's own error after another rank's failure (`AbortedError`,
a lost peer) or a rank stopped after one (`Outcome.cause`). The message lists the causes first, so
its first line after the heading is what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._worker import Outcome

__all__ = ["failed_ranks", "failure_message"]


def failed_ranks(outcomes: Sequence[Outcome]) -> list[int]:
    """The ranks that failed, causes first, each group in rank order.

    Example:
        >>> failed_ranks([Outcome("failed", reason="rank 0 (h, pid 1) failed: AbortedError: rank 1 failed"),
        ...               Outcome("failed", reason="rank 1 (h, pid 2) failed: ValueError: x", cause=True)])
        [1, 0]
    """
    failed = [rank for rank, outcome in enumerate(outcomes) if outcome.status == "failed"]
    return sorted(failed, key=lambda rank: (not outcomes[rank].cause, rank))


def failure_message(what: str, outcomes: Sequence[Outcome], after: str = "") -> str:
    """The error a failed call raises on the driver: how many ranks failed, then each one's reason.

    Example:
        >>> print(failure_message("RayExecutor.run", [Outcome("ok"),
        ...       Outcome("failed", reason="rank 1 (h, pid 2) failed: ValueError: x at t.py:3 in f")]))
        RayExecutor.run failed on 1 of 2 ranks:
          rank 1 (h, pid 2) failed: ValueError: x at t.py:3 in f
    """
    ranks = failed_ranks(outcomes)
    lines = [f"{what} failed on {len(ranks)} of {len(outcomes)} ranks:"]
    lines += [f"  {outcomes[rank].reason}" for rank in ranks]
    if after:
        lines.append(after)
    return "\n".join(lines)
