"""Decide each membership epoch's hosts from discovery, the blacklist, the np bounds and the resets (pure).

The driver feeds `Membership` what it saw (the discovery script's hosts, how an epoch ended, the
time) and acts on what it answers: an `Epoch` to launch, a `Wait` (too few slots for now) or a `Stop`
(an error to report). Nothing here runs a process or reads a clock, so every sequence of events is
unit-tested by hand.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence

from .. import errors
from ..errors import LaunchError

__all__ = ["FAILURES_ALIKE", "FAILURES_WITHOUT_COMMIT", "Ending", "Epoch", "Host", "Limits", "Membership", "Stop",
           "Wait", "blame_hosts", "cooldown_seconds", "error_of", "parse_discovery"]

FAILURES_WITHOUT_COMMIT = 3  # failed launches in a row with no commit, after which the job stops
FAILURES_ALIKE = 3  # failed launches in a row with the same error on more than one host: the program's
# A failure reason as the ranks write it (unison._job.summary.describe): its exception type and its
# innermost user frame, the last " at FILE:LINE in NAME" (the message before it may hold " at " too).
_REASON = re.compile(r"^rank \d+ \([^)]*\) failed: (?P<type>[A-Za-z_][\w.]*)(?::.*)? at "
                     r"(?P<where>[^ ]+:\d+ in [^ ]+)(?: <- .*)?$", re.DOTALL)
# unison's own errors that a rank raises because of another rank or the job (a peer lost, an abort, a
# stall): the same one on every host says nothing about the program.
_CONSEQUENCES = frozenset(name for name, value in vars(errors).items()
                          if isinstance(value, type) and issubclass(value, errors.HorovodInternalError))


def error_of(reason: str) -> str | None:
    """The exception type and line of a rank's failure reason, e.g. ``ValueError at train.py:88 in step``.

    None for failures that name no exception of the program: a rank killed or exiting, unison's own
    errors that are the consequence of another rank's failure, a reason cut short.

    Example:
        >>> error_of("rank 1 (h1, pid 7) failed: ValueError: bad at step 3 at train.py:88 in step <- train.py:9 in main")
        'ValueError at train.py:88 in step'
        >>> error_of("rank 1 (h1, pid 7) ended without shutting unison down (killed by signal 9 (SIGKILL)).") is None
        True
    """
    match = _REASON.match(reason.strip())
    if match is None or match["type"].rpartition(".")[2] in _CONSEQUENCES:
        return None
    return f"{match['type']} at {match['where']}"


def cooldown_seconds(low: float, high: float, count: int, draw: float) -> float:
    """How long a host stays blacklisted the `count`-th time it fails (Horovod's backoff).

    ``low * 2**count`` plus a jitter of ``draw * low`` (`draw` uniform in [0, 1)), kept within
    [`low`, `high`]: with ``--blacklist-cooldown-range 10 300``, 20-30 s after the first failure,
    40-50 s after the second, 80-90 s after the third, then 160-170 s, then 300 s each time.

    Example:
        >>> [cooldown_seconds(10, 300, count, 0.5) for count in (1, 2, 3, 4, 5, 6)]
        [25.0, 45.0, 85.0, 165.0, 300, 300]
    """
    return max(low, min(high, low * 2.0 ** min(count, 64) + draw * low))


@dataclasses.dataclass(frozen=True)
class Host:
    """A host and how many ranks it may run."""

    name: str
    slots: int


def parse_discovery(text: str, default_slots: int | None = None) -> tuple[Host, ...]:
    """The hosts a discovery script printed: one ``host:slots`` (or ``host``) per line.

    A bare ``host`` takes `default_slots` (``--slots-per-host``). Blank lines and ``#`` comments are
    skipped; a host listed twice keeps its first line.

    Example:
        >>> parse_discovery("h1:2\\nh2\\n", default_slots=1)
        (Host(name='h1', slots=2), Host(name='h2', slots=1))
    """
    hosts: dict[str, Host] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, slots_text = line.rpartition(":") if ":" in line else (line, "", "")
        if not sep:
            if default_slots is None:
                raise LaunchError(f"The host discovery script printed {raw.strip()!r} (line {number}) "
                                  "without slots. Print 'host:slots' or pass --slots-per-host K.")
            slots = default_slots
        else:
            try:
                slots = int(slots_text)
            except ValueError:
                slots = -1
        if not name or slots < 0:
            raise LaunchError(f"The host discovery script printed {raw.strip()!r} (line {number}); each "
                              "line must be 'host:slots' with slots a whole number >= 0, e.g. 'node1:4'.")
        if slots > 0 and name not in hosts:
            hosts[name] = Host(name, slots)
    return tuple(hosts.values())


@dataclasses.dataclass(frozen=True)
class Limits:
    """The bounds of an elastic job (unisonrun's --min-np, --max-np, --reset-limit, --blacklist-cooldown-range)."""

    min_np: int
    max_np: int | None = None  # None: as many as the hosts offer
    reset_limit: int | None = None  # None: no limit
    cooldown_range: tuple[float, float] | None = None  # None: a failed host stays blacklisted

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise LaunchError(f"--min-np must be at least 1. Got --min-np {self.min_np}.")
        if self.max_np is not None and self.max_np < self.min_np:
            raise LaunchError(f"--max-np must be at least --min-np. Got --min-np {self.min_np} "
                              f"--max-np {self.max_np}.")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise LaunchError(f"--reset-limit must be >= 0. Got --reset-limit {self.reset_limit}.")
        if self.cooldown_range is not None:
            low, high = self.cooldown_range
            if not 0 <= low <= high:
                raise LaunchError("--blacklist-cooldown-range A B needs 0 <= A <= B (seconds). "
                                  f"Got {low:g} {high:g}.")


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One launch: its number and its hosts in rank order (ranks fill each host's slots in turn)."""

    number: int
    hosts: tuple[Host, ...]

    @property
    def np(self) -> int:
        return sum(host.slots for host in self.hosts)

    def hosts_argument(self) -> str:
        """mpiexec's host list, e.g. ``h1:2,h2:1``."""
        return ",".join(f"{host.name}:{host.slots}" for host in self.hosts)

    def host_of(self, rank: int) -> str:
        """The host that runs `rank`."""
        for host in self.hosts:
            if rank < host.slots:
                return host.name
            rank -= host.slots
        raise ValueError(f"rank {rank} is beyond this epoch's {self.np} ranks")


@dataclasses.dataclass(frozen=True)
class Wait:
    """Too few slots for --min-np now; the driver polls discovery until --elastic-timeout."""

    available: int
    needed: int
    message: str


@dataclasses.dataclass(frozen=True)
class Stop:
    """The job cannot go on; `message` says why and what to change."""

    message: str


class Ending(enum.Enum):
    """How an epoch's launch ended."""

    FINISHED = "finished"  # every rank returned: the job is done
    HOSTS_UPDATED = "hosts_updated"  # the ranks committed and stopped for a new host set
    FAILED = "failed"  # a rank failed or vanished


def blame_hosts(epoch: Epoch, failed_ranks: Iterable[int], unreachable: Mapping[str, str]) -> dict[str, str]:
    """The hosts a failed epoch is blamed on, in the epoch's host order, each with why.

    A host is blamed when a rank on it failed (the supervisor named the rank), or when it cannot be
    reached the way mpiexec starts processes there (`unreachable`: host -> what its launcher said). The
    second is a host that vanished while the discovery script still lists it: every launch onto it
    fails inside mpiexec before any rank starts, so no rank is ever named, and without the blame each
    relaunch would cost a reset.

    Example:
        >>> epoch = Epoch(0, (Host("a", 2), Host("b", 1), Host("c", 1)))
        >>> blame_hosts(epoch, [1], {"c": "exit status 255"})
        {'a': 'rank 1 failed', 'c': 'unreachable: exit status 255'}
    """
    ranks: dict[str, list[int]] = {}
    for rank in sorted(set(failed_ranks)):
        if 0 <= rank < epoch.np:
            ranks.setdefault(epoch.host_of(rank), []).append(rank)
    blamed = {}
    for host in epoch.hosts:
        why = []
        if host.name in ranks:
            listed = ranks[host.name]
            why.append(f"rank {listed[0]} failed" if len(listed) == 1
                       else f"ranks {', '.join(map(str, listed))} failed")
        if host.name in unreachable:
            why.append(f"unreachable: {unreachable[host.name]}")
        if why:
            blamed[host.name] = "; ".join(why)
    return blamed


class Membership:
    """The elastic driver's decisions: which hosts each epoch runs on, whom to blacklist, when to give up.

    Example:
        >>> m = Membership(Limits(min_np=2, max_np=4))
        >>> plan = m.plan((Host("a", 2), Host("b", 4)), now=0.0)
        >>> plan.hosts_argument(), plan.number
        ('a:2,b:2', 0)
        >>> m.started(plan)
        >>> m.ended(Ending.FAILED, failed_hosts=("a",), now=1.0) is None
        True
        >>> m.plan((Host("a", 2), Host("b", 4)), now=2.0).hosts_argument()
        'b:4'
    """

    def __init__(self, limits: Limits, rng: random.Random | None = None) -> None:
        self.limits = limits
        self.rng = rng or random.Random()
        self.blacklist: dict[str, float] = {}  # host -> blacklisted until (inf: for good)
        self.reasons: dict[str, str] = {}  # host -> why it was blacklisted last
        self.blacklistings: dict[str, int] = {}  # host -> how many times it was blacklisted (the backoff)
        self.resets = 0
        self.epochs = 0
        self.failed_without_commit = 0  # failed epochs in a row that made no commit
        self.alike: list[tuple[str, tuple[str, ...]]] = []  # the last failed epochs in a row with one error: (error, hosts)
        self.current: Epoch | None = None

    def __repr__(self) -> str:
        return (f"Membership(epoch={self.current.number if self.current else None}, resets={self.resets}, "
                f"blacklisted={sorted(self.blacklist)})")

    def statistics(self) -> dict[str, int]:
        return {"epochs": self.epochs, "resets": self.resets, "blacklisted": len(self.blacklist)}

    def blacklisted(self, now: float) -> dict[str, tuple[float, str]]:
        """The hosts blacklisted at `now`: host -> (seconds left, inf for good; why)."""
        return {name: (until - now, self.reasons.get(name, "")) for name, until in sorted(self.blacklist.items())
                if until > now}

    def usable(self, discovered: Sequence[Host], now: float) -> tuple[Host, ...]:
        """The discovered hosts not blacklisted at `now`."""
        return tuple(host for host in discovered if self.blacklist.get(host.name, -1.0) <= now)

    def desired(self, discovered: Sequence[Host], now: float) -> tuple[Host, ...]:
        """The hosts (and slots) an epoch started now would use, before the --min-np check.

        Hosts of the running epoch come first, in their order, so that the surviving ranks keep their
        places and rank 0 stays where it was when it can; new hosts follow in discovery order. The
        total is capped at --max-np.
        """
        usable = {host.name: host for host in self.usable(discovered, now)}
        order = [h.name for h in self.current.hosts if h.name in usable] if self.current else []
        order += [name for name in usable if name not in order]
        room = self.limits.max_np if self.limits.max_np is not None else sum(h.slots for h in usable.values())
        chosen = []
        for name in order:
            take = min(usable[name].slots, room)
            if take <= 0:
                break
            chosen.append(Host(name, take))
            room -= take
        return tuple(chosen)

    def plan(self, discovered: Sequence[Host], now: float) -> Epoch | Wait | Stop:
        """What to launch next given the hosts discovery offers now."""
        hosts = self.desired(discovered, now)
        available = sum(host.slots for host in hosts)
        if available >= self.limits.min_np:
            return Epoch(self.epochs, hosts)
        listed = ", ".join(f"{h.name}:{h.slots}" for h in discovered) or "none"
        blocked = sorted(name for name in self.blacklist if self.blacklist[name] > now)
        if discovered and not self.usable(discovered, now) and self.limits.cooldown_range is None:
            program = self._programs_error(2)
            if program:
                return Stop(f"every host the discovery script offers is blacklisted after failing ({listed}); "
                            f"{self.limits.min_np} ranks needed. {program}")
            return Stop(f"every host the discovery script offers is blacklisted after failing ({listed}); "
                        f"{self.limits.min_np} ranks needed. Fix the hosts, or pass "
                        "--blacklist-cooldown-range A B so that failed hosts are tried again.")
        return Wait(available, self.limits.min_np,
                    f"{available} ranks available, {self.limits.min_np} needed (--min-np "
                    f"{self.limits.min_np}); discovered: {listed}"
                    + (f"; blacklisted: {', '.join(blocked)}" if blocked else ""))

    def _programs_error(self, launches: int) -> str:
        """Why the failures look like the program's, when the last `launches` or more failed launches in
        a row had the same error on more than one host; else ''."""
        hosts = {host for _, failed in self.alike for host in failed}
        if len(self.alike) < launches or len(hosts) < 2:
            return ""
        return (f"{len(self.alike)} launches in a row failed with the same error ({self.alike[-1][0]}) on "
                f"{len(hosts)} different hosts ({', '.join(sorted(hosts))}): that is the program, not the "
                "hosts. Fix the error (its traceback is above); relaunching would only blacklist more hosts.")

    def started(self, epoch: Epoch) -> None:
        """Record that `epoch` was launched."""
        self.current = epoch
        self.epochs = epoch.number + 1

    def wants_change(self, discovered: Sequence[Host], now: float) -> bool:
        """True when discovery now asks for other hosts than the running epoch's: the ranks should stop
        at their next commit so the driver can relaunch (a host added, removed, or its slots changed)."""
        return self.current is not None and self.desired(discovered, now) != self.current.hosts

    def ended(self, ending: Ending, failed_hosts: Sequence[str] | Mapping[str, str] = (),
              now: float = 0.0, committed: bool = True, error: str | None = None) -> Stop | None:
        """Record how the running epoch ended; a `Stop` when the job must not be reset again.

        The failed hosts (`blame_hosts`; a mapping keeps why) are blacklisted, for good or, with a
        cooldown range, for `cooldown_seconds` (backing off exponentially with each failure of the
        same host). Every reset (a failure or a host change)
        counts against --reset-limit. `committed` says whether the epoch made any commit: after
        `FAILURES_WITHOUT_COMMIT` failed epochs in a row that made none, the job stops, whatever the
        reset limit (a program that fails before its first commit would otherwise be relaunched for
        as long as hosts are left, or forever when the failure names no host). `error` is the failed
        epoch's first failure as `error_of` reads it: after `FAILURES_ALIKE` failed epochs in a row with
        the same error on more than one host the job stops, saying it is the program, not the hosts.

        Example:
            >>> m = Membership(Limits(min_np=1, max_np=1))
            >>> [m.ended(Ending.FAILED, committed=False) is None for _ in range(2)]
            [True, True]
            >>> print(m.ended(Ending.FAILED, committed=False).message)  # doctest: +ELLIPSIS
            3 launches in a row failed before their first commit; stopping instead of launching again...
        """
        if ending is Ending.FINISHED:
            return None
        failed_early = ending is Ending.FAILED and not committed
        self.failed_without_commit = self.failed_without_commit + 1 if failed_early else 0
        if ending is Ending.FAILED and error is not None:
            if self.alike and self.alike[-1][0] != error:
                self.alike = []
            self.alike.append((error, tuple(failed_hosts)))
        elif ending is Ending.FAILED:
            self.alike = []
        for name in failed_hosts:
            count = self.blacklistings[name] = self.blacklistings.get(name, 0) + 1
            cooldown = (cooldown_seconds(*self.limits.cooldown_range, count, self.rng.random())
                        if self.limits.cooldown_range is not None else math.inf)
            self.blacklist[name] = now + cooldown
            self.reasons[name] = failed_hosts[name] if isinstance(failed_hosts, Mapping) else "failed"
        self.resets += 1
        program = self._programs_error(FAILURES_ALIKE)
        if program:
            return Stop(f"{program} Stopping.")
        if self.failed_without_commit >= FAILURES_WITHOUT_COMMIT:
            return Stop(f"{self.failed_without_commit} launches in a row failed before their first commit; "
                        "stopping instead of launching again. The ranks' output above says why: a program "
                        "that fails every time it starts needs fixing, not relaunching.")
        limit = self.limits.reset_limit
        if limit is not None and self.resets > limit:
            why = "a rank failed" if ending is Ending.FAILED else "the hosts changed"
            return Stop(f"the job needs reset {self.resets} ({why}), but --reset-limit is {limit}; "
                        "stopping. Raise --reset-limit to allow more resets.")
        return None

