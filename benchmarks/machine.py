"""How busy the machine was during a measurement: CPU steal, which the load average does not show; and
where the ranks ran (`current_core`, `bind_to_core`).

On a virtual machine the hypervisor may run other guests on our cores; Linux counts that time as
*steal* in ``/proc/stat``. The load average counts only this guest's runnable threads, so a run that
lost a third of its CPU to other guests looks as calm as a quiet one. Seen on the 2-core test machine:
steal of 5% to 54% per second during training benchmarks, whose rounds swung by up to 25% in
throughput in the same runs. The benchmarks record the share of steal over each run next to the load
average.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bind_to_core", "cpu_times", "current_core", "percent", "shared_a_core", "steal_share"]

_STAT = Path("/proc/stat")


def cpu_times() -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) in clock ticks since boot, summed over cores; None where the
    kernel does not report steal (not Linux, or a kernel without the field)."""
    try:
        first = _STAT.read_text().splitlines()[0].split()
    except OSError:
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user
    ticks = [int(v) for v in first[1:9]]
    return sum(ticks), ticks[7]


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two `cpu_times()` readings (0.0 to 1.0), or None.

    Example:
        >>> steal_share((1000, 10), (1200, 60))
        0.25
    """
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def percent(share: float | None) -> str:
    """A share as a whole percentage, or "unknown" (as `steal_share` returns None).

    Example:
        >>> percent(0.25), percent(None)
        ('25%', 'unknown')
    """
    return "unknown" if share is None else f"{share:.0%}"


def current_core() -> int | None:
    """The core the calling thread runs on now (Linux's ``/proc/thread-self/stat``), or None."""
    try:
        fields = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[36])  # field 39 of stat(5): "processor"; the split starts at field 3


def bind_to_core(index: int) -> int | None:
    """Pin every thread of this process, and the threads it starts later, to the `index`-th core it
    may run on; return that core, or None where there are fewer cores than `index` + 1 (or no Linux).

    With as many busy ranks as cores, Linux sometimes runs two ranks on one core for a while (after a
    spell of sleeping waits, a woken process is placed beside its waker), and every call of those
    rounds runs several times slower, raw MPI included: binding, as ``mpiexec -bind-to core`` does,
    keeps that out of a measurement.
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
        tasks = [int(tid) for tid in os.listdir("/proc/self/task")]
    except (AttributeError, OSError):
        return None
    if index >= len(cores):
        return None
    for tid in tasks:
        os.sched_setaffinity(tid, {cores[index]})
    return cores[index]


def shared_a_core(samples_by_rank: list[list[int | None]]) -> bool:
    """Whether two ranks of one host were seen on the same core at the same sample.

    Example:
        >>> shared_a_core([[0, 0, 1], [1, 1, 1]]), shared_a_core([[0, 1], [1, 0]]), shared_a_core([[None], [None]])
        (True, False, False)
    """
    for at_once in zip(*samples_by_rank):
        seen = [core for core in at_once if core is not None]
        if len(seen) != len(set(seen)):
            return True
    return False
