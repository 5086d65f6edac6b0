"""What a rank prints when an error ends it: one full report per failure, one line from every other rank.

A failure is reported in full once: by unisonrun when it launched the job (it reads every rank's
marker), else by the rank whose own error it is (its traceback), or by rank 0 when no single rank
owns it (an error every rank of a collective raised, a stall, a peer found lost). Every other rank
prints one line: where it stopped in the user's code, the failure in a few words, and who reports it.
Tracebacks leave out unison's own frames. Pure: the exception hook (`unison._job.failure`) gathers
the facts and prints what `decide` returns.

| the error on this rank | under unisonrun | rank 0 otherwise | other ranks otherwise |
|---|---|---|---|
| its own (``ValueError``, ...) | traceback | traceback and ``unison: <reason>; stopping every rank.`` | the same |
| raised on every rank of a collective (``MismatchError``) | one line | traceback and one line | one line |
| the job's stop (``AbortedError``, ``JobInterrupt``, ``StallError``) | one line | one line; the full reason when rank 0 is the reporter | one line |
| peers shut unison down (``ShutdownError``: ``rank(s) [1] called shutdown() (or exited)``) | one line | one line, the full reason and `UNEVEN_DATA` (the lowest rank that got it reports it) | the same |

The ranks of one shared error are named odd one out first (`odd_order`): unisonrun lists them so, and
under torchrun that rank's error file is the first failure (`unison._job.torch_error_file`).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping

from ..errors import AbortedError, JobInterrupt, MismatchError, ShutdownError, StallError
from ..protocol.stall import DEADLOCK_TITLE, STALL_TITLE
from .summary import CALLBACK_PREFIX, parse_reason

__all__ = ["SHARED_ERRORS", "UNEVEN_DATA", "Role", "Said", "decide", "odd_order", "role_of", "shared_error",
           "stop_words"]

SHARED_ERRORS = frozenset({"MismatchError"})  # raised on every rank of the collective, with one message
# The ShutdownError of a rank whose peers shut unison down (or exited) while it had collectives pending
# (`unison.engine.actions`): a consequence of their end, not this rank's own error.
_PEER_SHUTDOWN = re.compile(r"^unison has been shut down: rank\(s\) \[(?P<ranks>\d+(?:, \d+)*)\] called shutdown\(\)")
# The usual cause of a peer's shutdown, and its fix (unisonrun gives it in its own report when it launched the job).
UNEVEN_DATA = "With uneven data, a rank that runs out of data first must call hvd.join() instead of finishing."
_SITE = re.compile(r"^(?P<file>.+?):(?P<line>\d+) in (?P<function>\S+)")


class Role(enum.Enum):
    """What an uncaught error is to the rank it ends."""

    OWN = "own"  # the rank's own error: it reports it
    SHARED = "shared"  # raised on every rank of a collective with the same message
    CONSEQUENCE = "consequence"  # the job stopped for a reason found elsewhere


@dataclasses.dataclass(frozen=True)
class Said:
    """What the exception hook prints: the traceback (unison's frames left out) or not, then `line`."""

    traceback: bool
    line: str


def role_of(exc: BaseException) -> Role:
    """What `exc` is to the rank it ends.

    Example:
        >>> role_of(ValueError("x")), role_of(MismatchError("x")), role_of(AbortedError("x"))
        (<Role.OWN: 'own'>, <Role.SHARED: 'shared'>, <Role.CONSEQUENCE: 'consequence'>)
    """
    if shared_error(exc):
        return Role.SHARED
    if isinstance(exc, (AbortedError, StallError, JobInterrupt)):
        return Role.CONSEQUENCE
    if isinstance(exc, ShutdownError) and _PEER_SHUTDOWN.match(str(exc)):
        return Role.CONSEQUENCE
    return Role.OWN


def odd_order(sites: Mapping[int, str]) -> list[int]:
    """The ranks of one shared error, odd one out first, from each rank's call site (rank -> site, '' unknown).

    First the ranks whose call site the fewest ranks share; among as many, when every site is in one
    function of one file, the rank whose call comes first (in straight-line code, the extra call the
    other ranks went past; within a loop that need not hold, and the sites say which call each made);
    then by rank. A site reads ``file:line in function``, maybe followed by its callers and origin.

    Example:
        >>> odd_order({0: "a.py:82 in main", 1: "a.py:81 in main (DDP bucket 0)", 2: "a.py:82 in main"})
        [1, 0, 2]
    """
    parsed: dict[int, tuple[str, int, str] | None] = {}
    for rank, site in sites.items():
        match = _SITE.match(site.split(" <- ")[0]) if site else None
        parsed[rank] = (match["file"], int(match["line"]), match["function"]) if match else None
    sharing = {rank: sum(1 for other in parsed.values() if other == here) for rank, here in parsed.items()}
    places = {(here[0], here[2]) for here in parsed.values() if here is not None}
    one_function = len(places) == 1 and None not in parsed.values()

    def key(rank: int) -> tuple[int, int, int]:
        here = parsed[rank]
        return sharing[rank], here[1] if one_function and here is not None else 0, rank

    return sorted(parsed, key=key)


def shared_error(exc: BaseException) -> str:
    """The name of the error every rank of a collective raised that `exc` is or carries, else ''.

    torch's autograd re-raises an error of a DDP communication hook as a ``RuntimeError`` that carries
    it as text (``Got the following error when running the callback: MismatchError: ...``).

    Example:
        >>> shared_error(RuntimeError("Got the following error when running the callback: MismatchError: m"))
        'MismatchError'
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MismatchError):
            return type(seen).__name__
        text = str(seen)
        if type(seen) is RuntimeError and text.startswith(CALLBACK_PREFIX):
            name = text[len(CALLBACK_PREFIX):].split(":", 1)[0]
            if name in SHARED_ERRORS:
                return name
        seen = seen.__cause__
    return ""


def stop_words(reason: str) -> tuple[str, int | None]:
    """A job stop's reason in a few words, and the rank that reports it in full itself (None: rank 0).

    A rank's own failure (``rank R (...) failed: T: ...``) is reported by rank R, unless every rank of a
    collective raised it; a stall, a deadlock, a lost peer are rank 0's to report; ranks that shut
    unison down (or exited) while others had collectives pending say nothing, so the lowest rank that
    did not reports it.

    Example:
        >>> stop_words("rank 3 (h, pid 9) failed: ValueError: bad at train.py:5 in main")
        ('rank 3 (h, pid 9) failed (ValueError)', 3)
        >>> stop_words("Deadlock: every rank that ...\\n  rank 0 waits for allreduce.x")
        ('the job deadlocked', None)
        >>> stop_words("unison has been shut down: rank(s) [0, 2] called shutdown() (or exited) while ...")
        ('rank(s) [0, 2] shut unison down (or exited) while this rank had collectives pending', 1)
    """
    parsed = parse_reason(reason.strip().splitlines()[0] if reason.strip() else "")
    if parsed is not None:
        return f"{parsed.who} failed ({parsed.error})", None if parsed.error in SHARED_ERRORS else parsed.rank
    text = reason.strip()
    if text.startswith(DEADLOCK_TITLE):
        return "the job deadlocked", None
    if text.startswith(STALL_TITLE):
        return "the job stalled", None
    peers = _PEER_SHUTDOWN.match(text)
    if peers is not None:
        gone = {int(rank) for rank in peers["ranks"].split(", ")}
        reporter = next(rank for rank in range(len(gone) + 1) if rank not in gone)  # the lowest rank left
        return f"rank(s) [{peers['ranks']}] shut unison down (or exited) while this rank had collectives pending", \
            reporter
    first = text.splitlines()[0] if text else "the job stopped"
    return first, None


def decide(role: Role, *, rank: int, who: str, where: str, error: str, reason: str, under_launcher: bool,
           aborted_reason: str = "", logged: bool = False) -> Said:
    """What the exception hook of `rank` prints for an uncaught error.

    Args:
        role: what the error is to this rank (`role_of`).
        rank: this rank; `who` names it (``rank R (host, pid P)``).
        where: the user's frames the error came through (``file:line in f <- ...``), '' if none.
        error: the error's type name.
        reason: for a consequence, why the job stopped (the engine's stop error, or the error's text).
        under_launcher: unisonrun launched the job and reports the failure itself.
        aborted_reason: the abort this rank started for its own error ('' when it did not).
        logged: rank 0 has logged `reason` in full already (the stall inspector's report of a stall).

    Example:
        >>> decide(Role.CONSEQUENCE, rank=0, who="rank 0 (h, pid 7)", where="train.py:8 in main",
        ...        error="AbortedError", reason="rank 1 (h, pid 9) failed: ValueError: x", under_launcher=True)
        Said(traceback=False, line='unison: rank 0 (h, pid 7) stopped at train.py:8 in main: AbortedError: rank 1 (h, pid 9) failed (ValueError); unisonrun reports it.')
    """
    at = f" at {where}" if where else ""
    if role is Role.OWN:
        if under_launcher or not aborted_reason:
            return Said(True, "")
        return Said(True, f"unison: {aborted_reason}; stopping every rank.")
    if role is Role.SHARED:
        words = f"{error}, raised on every rank of the collective"
        if under_launcher:
            return Said(False, f"unison: {who} stopped{at}: {words}; unisonrun reports it.")
        if rank == 0:
            return Said(True, f"unison: {who} stopped{at}: {words}; stopping every rank.")
        return Said(False, f"unison: {who} stopped{at}: {words}; rank 0 reports it.")
    words, reporter = stop_words(reason)
    if under_launcher:
        return Said(False, f"unison: {who} stopped{at}: {error}: {words}; unisonrun reports it.")
    if (reporter == rank or reporter is None and rank == 0) and not logged:
        full = " ".join(part.strip() for part in reason.strip().splitlines())
        if _PEER_SHUTDOWN.match(reason.strip()) and "hvd.join()" not in full:
            full = f"{full} {UNEVEN_DATA}"
        return Said(False, f"unison: {who} stopped{at}: {error}: {full}")
    return Said(False, f"unison: {who} stopped{at}: {error}: {words}; rank {0 if reporter is None else reporter} "
                       "reports it.")
