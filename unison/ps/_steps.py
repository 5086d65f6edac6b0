"""The rules of a server's steps, as pure functions: which push is accepted, when a step is complete, who holds it up.

In synchronous mode a server's version is the number of steps it has applied; step `s` is applied
once every trainer pushed its gradients of step `s`, and a trainer's pull of step `s` waits for
version `s`. In asynchronous mode every push is applied when it arrives and the version counts pushes;
a push's staleness is how many updates were applied between the pull it was computed from and it.

Every push of a trainer to a server carries a sequence number (1, 2, ... per server); a server
remembers the last one it took from each trainer, so a push the trainer sent again (its reply was
lost) is acknowledged without being applied twice.

A server that restarts comes back at the step of its checkpoint (or 0 without one), while the
trainers are at their own step. In synchronous mode their step goes on only where the two agree
(the checkpoint was taken at the step the trainers are at); otherwise steps were lost on this server
that the trainers and other servers kept, and the trainers' calls are refused (`resume_refusal`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set

__all__ = ["AHEAD_STEPS", "EVERY_TRAINER_FINISHED", "TrainerSeen", "is_duplicate", "lost_trainers", "push_refusal", "resume_refusal",
           "server_end", "staleness", "step_blockers", "step_complete"]

# A synchronous push may run this many steps ahead of the server's version (its gradients wait).
AHEAD_STEPS = 2
# `server_end`'s reason when the work ended the way it should (a server then exits with status 0)
EVERY_TRAINER_FINISHED = "every trainer finished"


@dataclasses.dataclass(frozen=True)
class TrainerSeen:
    """What a server knows of one trainer: where it runs, when it was last heard, how far it pushed."""

    host: str = ""
    pid: int = 0
    last_seen: float = 0.0
    pushed: int = -1  # the last step pushed (synchronous mode), -1 before any
    finished: bool = False
    first_seen: float = 0.0  # when it first said hello (0: its last_seen stands in)


def is_duplicate(sequence: int, last_sequence: int) -> bool:
    """Whether a push numbered `sequence` was taken before, the last one taken from its trainer being `last_sequence`.

    A trainer numbers its pushes to each server 1, 2, ...; it sends one again only when it got no
    reply, so anything at or below the last number taken is a resend. Numbers may skip (pushes taken
    after a server's last checkpoint are forgotten when it restarts from it); 0 means an unnumbered
    push, which is always taken.

    Example:
        >>> is_duplicate(7, 7), is_duplicate(8, 7), is_duplicate(0, 7)
        (True, False, False)
    """
    return 0 < sequence <= last_sequence


def push_refusal(*, step: int, version: int, trainer: int, already: bool) -> str:
    """Why a synchronous push of `step` by `trainer` is refused, or "" when it is accepted.

    Example:
        >>> push_refusal(step=3, version=5, trainer=1, already=False)[:40]
        'trainer 1 pushed gradients of step 3, bu'
    """
    if step < version:
        return (f"trainer {trainer} pushed gradients of step {step}, but this server has applied steps up to "
                f"{version - 1}; the trainer is behind (it restarted, or the server resumed from a newer "
                "checkpoint). Restart the trainer so it pulls the current parameters.")
    if step > version + AHEAD_STEPS:
        return (f"trainer {trainer} pushed gradients of step {step}, but this server is at step {version}; a "
                f"push may run at most {AHEAD_STEPS} steps ahead. Pull (which waits for the step) before pushing "
                "again, or the server resumed from an older checkpoint: restart every trainer.")
    if already:
        return f"trainer {trainer} pushed gradients of step {step} twice; push once per step."
    return ""


def resume_refusal(*, server: int, version: int, restored: bool, trainer: int, step: int) -> str:
    """Why a synchronous call of `trainer` at `step` is refused by a server process it has not met, or "" when it goes on.

    The trainer said hello to an earlier process of server `server`, which restarted at step
    `version` (from its checkpoint when `restored`). The trainer has pushed steps below `step`; the
    server has applied steps below `version`. Only when the two are equal does this server hold what
    the trainer believes it does; then the trainer goes on with the new process.

    Example:
        >>> resume_refusal(server=0, version=5, restored=True, trainer=1, step=5)
        ''
        >>> resume_refusal(server=0, version=5, restored=True, trainer=1, step=7)[:81]
        'parameter server 0 restarted from its checkpoint at step 5, but trainer 1 is at s'
    """
    if step == version:
        return ""
    how = f"from its checkpoint at step {version}" if restored else "without a checkpoint, at step 0"
    if step > version:
        lost = f"steps {version} to {step - 1}" if step - 1 > version else f"step {version}"
        why = (f"{lost} of this server are lost while the trainers (and any other servers) went on past them, so "
               "synchronous training cannot go on consistently")
    else:
        why = ("the checkpoint holds steps the trainer has not pushed, so it is not this job's checkpoint or "
               "the trainer is not this job's")
    return (f"parameter server {server} restarted {how}, but trainer {trainer} is at step {step}: {why}. Restart "
            "the job from checkpoints of one step on every server (ps.checkpoint() called by a trainer between "
            "its pull and its push writes them), servers first; a trainer that starts takes the servers' step.")


def step_complete(contributors: Set[int], num_trainers: int) -> bool:
    """Whether every trainer has pushed the step."""
    return len(contributors) == num_trainers


def _first_seen(trainers: Mapping[int, TrainerSeen], now: float) -> float:
    return min((t.first_seen or t.last_seen for t in trainers.values() if t.pid), default=now)


def _lost(trainer: int, seen: TrainerSeen | None, first_seen: float, now: float, timeout_seconds: float,
          sync: bool) -> str:
    """Why `trainer`, which has not finished, is lost, as text; "" while it is not."""
    if seen is None or not seen.pid:
        if now - first_seen > timeout_seconds:
            return f"trainer {trainer} never connected ({now - first_seen:.1f} s after the first)"
        return ""
    if now - seen.last_seen > timeout_seconds:
        pushed = f" pushed steps up to {seen.pushed} and" if sync else ""
        return (f"trainer {trainer} ({seen.host}, pid {seen.pid}){pushed} sent nothing for "
                f"{now - seen.last_seen:.1f} s; it died or is stopped")
    return ""


def step_blockers(step: int, contributors: Set[int], trainers: Mapping[int, TrainerSeen], num_trainers: int,
                  now: float, timeout_seconds: float) -> list[str]:
    """Why step `step` cannot complete: each missing trainer that is gone, as text; [] while it may yet.

    A trainer is gone when it finished, or was not heard for `timeout_seconds`, or never arrived
    within that long of the first.

    Example:
        >>> seen = {0: TrainerSeen("a", 10, 100.0, 3), 1: TrainerSeen("b", 11, 90.0, 2)}
        >>> step_blockers(3, {0}, seen, 2, 101.0, 5.0)
        ['trainer 1 (b, pid 11) pushed steps up to 2 and sent nothing for 11.0 s; it died or is stopped']
    """
    reasons = []
    first_seen = _first_seen(trainers, now)
    for trainer in range(num_trainers):
        if trainer in contributors:
            continue
        seen = trainers.get(trainer)
        if seen is not None and seen.pid and seen.finished:
            reasons.append(f"trainer {trainer} ({seen.host}, pid {seen.pid}) pushed steps up to {seen.pushed} and "
                           "finished")
            continue
        lost = _lost(trainer, seen, first_seen, now, timeout_seconds, sync=True)
        if lost:
            reasons.append(lost)
    return reasons


def lost_trainers(trainers: Mapping[int, TrainerSeen], num_trainers: int, now: float, timeout_seconds: float,
                  sync: bool = False) -> dict[int, str]:
    """The trainers that did not finish and are gone, with why: silent for `timeout_seconds`, or never came.

    A trainer that never said hello counts as lost once `timeout_seconds` passed since the first
    trainer did (none came: nobody is lost). A lost trainer that is heard from again is no longer
    lost.

    Example:
        >>> seen = {0: TrainerSeen("a", 10, 100.0, finished=True), 1: TrainerSeen("b", 11, 90.0)}
        >>> lost_trainers(seen, 2, 101.0, 5.0)
        {1: 'trainer 1 (b, pid 11) sent nothing for 11.0 s; it died or is stopped'}
    """
    first_seen = _first_seen(trainers, now)
    lost = {}
    for trainer in range(num_trainers):
        seen = trainers.get(trainer)
        if seen is not None and seen.finished:
            continue
        reason = _lost(trainer, seen, first_seen, now, timeout_seconds, sync)
        if reason:
            lost[trainer] = reason
    return lost


def server_end(*, sync: bool, trainers: Mapping[int, TrainerSeen], num_trainers: int, now: float,
               timeout_seconds: float, failure: str = "", told: Set[int] = frozenset()) -> str:
    """Why a server's work is over, as text; "" while a trainer may still need it.

    The rule: every trainer finished; or (asynchronous) every trainer finished or is lost: the
    others went on without the lost ones; or (synchronous) a step failed (`failure`, with a lost
    trainer) and every trainer finished, is lost, or was told of the failure (`told`). A server
    then writes its last checkpoint and exits.

    Example:
        >>> seen = {0: TrainerSeen("a", 10, 100.0, finished=True), 1: TrainerSeen("b", 11, 90.0)}
        >>> server_end(sync=False, trainers=seen, num_trainers=2, now=101.0, timeout_seconds=5.0)
        'trainer 0 finished; trainer 1 (b, pid 11) sent nothing for 11.0 s; it died or is stopped'
        >>> server_end(sync=False, trainers=seen, num_trainers=2, now=94.0, timeout_seconds=5.0)
        ''
    """
    finished = [t for t in range(num_trainers) if (seen := trainers.get(t)) is not None and seen.finished]
    if len(finished) == num_trainers:
        return EVERY_TRAINER_FINISHED
    lost = lost_trainers(trainers, num_trainers, now, timeout_seconds, sync)
    waiting = [t for t in range(num_trainers) if t not in finished and t not in lost and t not in told]
    if waiting or (sync and not failure and not lost):
        return ""
    done = [f"trainer{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))} finished"] if finished else []
    if failure:
        informed = sorted(set(told) - set(finished) - set(lost))
        done += [f"trainer{'s' if len(informed) > 1 else ''} {', '.join(map(str, informed))} got the error"] \
            if informed else []
        return "; ".join([f"synchronous training stopped: {failure}", *done, *lost.values()])
    return "; ".join([*done, *lost.values()])


def staleness(version: int, based_on: int) -> int:
    """Updates applied between the pull a push was computed from and the push (0 when none)."""
    return max(0, version - based_on)
