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
"""

from __future__ import annotations

import dataclasses
import enum

from ..errors import AbortedError, JobInterrupt, MismatchError, StallError
from ..protocol.stall import DEADLOCK_TITLE
from .summary import CALLBACK_PREFIX, parse_reason

__all__ = ["SHARED_ERRORS", "Role", "Said", "decide", "role_of", "shared_error", "stop_words"]

SHARED_ERRORS = frozenset({"MismatchError"})  # raised on every rank of the collective, with one message


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
    return Role.OWN


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
    collective raised it; a stall, a deadlock, a lost peer are rank 0's to report.

    Example:
        >>> stop_words("rank 3 (h, pid 9) failed: ValueError: bad at train.py:5 in main")
        ('rank 3 (h, pid 9) failed (ValueError)', 3)
        >>> stop_words("Deadlock: every rank that ...\\n  rank 0 waits for allreduce.x")
        ('the job deadlocked', None)
    """
    parsed = parse_reason(reason.strip().splitlines()[0] if reason.strip() else "")
    if parsed is not None:
        return f"{parsed.who} failed ({parsed.error})", None if parsed.error in SHARED_ERRORS else parsed.rank
    text = reason.strip()
    if text.startswith(DEADLOCK_TITLE):
        return "the job deadlocked", None
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
    if reporter is None and rank == 0 and not logged:
        full = " ".join(part.strip() for part in reason.strip().splitlines())
        return Said(False, f"unison: {who} stopped{at}: {error}: {full}")
    return Said(False, f"unison: {who} stopped{at}: {error}: {words}; rank {0 if reporter is None else reporter} "
                       "reports it.")
