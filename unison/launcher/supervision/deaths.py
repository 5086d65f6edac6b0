"""Learn in which order watched processes of this host died, from the kernel rather than from polling.

When one rank dies, mpiexec kills the others within a millisecond or so: two deaths seen in the same
poll cannot be told apart by polling. A pidfd (``pidfd_open``) becomes readable when its process
exits, and epoll hands ready descriptors back in the order they became ready, so the order survives
however late the supervisor looks. The rank that died first is the one whose exit made mpiexec (or
Hydra's proxy) kill the rest: its death necessarily came before theirs.

Where pidfds are not available (Linux before 5.3, other systems), deaths are found by polling and
those seen in the same poll are reported together, in rank order, as indistinguishable.
"""

from __future__ import annotations

import errno
import os
import select

__all__ = ["DeathWatch", "alive"]


def alive(pid: int) -> bool:
    """True while `pid` runs (zombies count as dead: they have exited, only their status is unread)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill(pid, 0)


class DeathWatch:
    """Watch processes by rank; `deaths()` returns the ranks of those that died since, first death first.

    Example:
        >>> watch = DeathWatch()
        >>> watch.watch(1, os.getpid())
        >>> watch.deaths()
        []
        >>> watch.close()
    """

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") and hasattr(os, "pidfd_open") else None
        self._by_fd: dict[int, int] = {}
        self._polled: dict[int, int] = {}
        self._gone: list[list[int]] = []  # already gone when watched: order unknown
        self.kernel_ordered = self._epoll is not None

    def __repr__(self) -> str:
        return (f"<DeathWatch watching={len(self._by_fd) + len(self._polled)} "
                f"kernel_ordered={self.kernel_ordered}>")

    def watch(self, key: int, pid: int) -> None:
        """Start watching `pid` under `key` (its rank); a process already gone is reported at once."""
        if self._epoll is not None:
            try:
                fd = os.pidfd_open(pid)
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    self._gone.append([key])
                    return
                if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    raise
            else:
                self._by_fd[fd] = key
                self._epoll.register(fd, select.EPOLLIN)
                return
        self._polled[key] = pid

    def deaths(self) -> list[list[int]]:
        """Keys of the processes that died since the last call, as groups in the order of death.

        A group of several keys means their order is unknown (they were found dead by polling in the
        same look, or were already gone when watched); within it, keys are sorted.
        """
        groups: list[list[int]] = self._gone
        self._gone = []
        if self._epoll is not None and self._by_fd:
            for fd, _ in self._epoll.poll(0, len(self._by_fd)):
                groups.append([self._by_fd.pop(fd)])
                self._epoll.unregister(fd)
                os.close(fd)
        dead = [key for key, pid in self._polled.items() if not alive(pid)]
        if dead:
            for key in dead:
                del self._polled[key]
            groups.append(sorted(dead))
        return groups

    def close(self) -> None:
        """Stop watching and release the descriptors."""
        for fd in self._by_fd:
            os.close(fd)
        self._by_fd.clear()
        self._polled.clear()
        if self._epoll is not None:
            self._epoll.close()
