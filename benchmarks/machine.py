"""How busy the machine was during a measurement: CPU steal, which the load average does not show.

On a virtual machine the hypervisor may run other guests on our cores; Linux counts that time as
*steal* in ``/proc/stat``. The load average counts only this guest's runnable threads, so a run that
lost a third of its CPU to other guests looks as calm as a quiet one. Seen on the 2-core test machine:
steal of 5% to 54% per second during training benchmarks, whose rounds swung by up to 25% in
throughput in the same runs. The benchmarks record the share of steal over each run next to the load
average.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["cpu_times", "percent", "steal_share"]

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
