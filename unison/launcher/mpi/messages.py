"""Relay mpiexec's output to ours, holding back MPICH's own report of a stop that unison explains.

When a rank fails, MPICH's mpiexec prints a banner (``BAD TERMINATION OF ONE OF YOUR APPLICATION
PROCESSES ... EXIT CODE: 9 ... YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)``)
and Hydra adds cleanup lines (``[mpiexec@host] HYDT_bscu_wait_for_completion ...``). They describe
MPICH's own stop of the other ranks, not the failure: the exit code and signal are those of the ranks
it killed. unisonrun names the failing rank itself, so these lines are held back (`MessageFilter`,
pure) and, once the job has ended, dropped or written to a file when unison explained the stop, and
printed as they were when it did not. Everything else mpiexec writes (the ranks' output, Hydra's
launch errors) passes at once, byte for byte; a line without its newline yet (a progress bar's
``\\r``) passes as soon as it cannot be the start of a held line. With MPICH's mpiexec marking each
rank's pieces (`unison.launcher.mpi.lines`), the relay passes each rank's lines whole, and only
mpiexec's own output goes through the filter.
"""

from __future__ import annotations

import enum
import math
import os
import re
import select
import threading
import time
from collections.abc import Callable, Sequence

from .lines import RankLines, RankTags

__all__ = ["MessageFilter", "OutputRelay"]

# Hydra's lines about waiting for ranks that it (or an abort) stopped; launch errors do not match.
_CLEANUP = re.compile(rb"^\[(mpiexec|proxy:[^\]@]*)@[^\]]*\] .*(wait_for_completion|waiting for completion|"
                      rb"wait_for_event|waiting for event|control_cmd_cb|assert \(!closed\) failed)"
                      rb"|^Ctrl-C caught\.\.\. cleaning up processes$")  # Hydra's forced stop (a second Ctrl-C)
# What Hydra says when it gets SIGINT: true of a user's Ctrl-C, which unisonrun passes on, but not of the
# SIGINT unisonrun sends at --timeout (`MessageFilter.hold_ctrl_c_notice`).
_CTRL_C_NOTICE = re.compile(rb"^\[mpiexec@[^\]]*\] (Sending Ctrl-C to processes as requested|"
                            rb"Press Ctrl-C again to force abort)$")
_RULE_MIN = 40  # the banner's rules are 83 '=' characters
_TRAILER = (b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING", b"This typically refers to a problem",
            b"Please see the FAQ page")
_HOLD_PREFIXES = (b"=", b"[", b"YOUR APPLICATION", b"This typically", b"Please see the FAQ", b"Ctrl-C caught")


def _is_rule(line: bytes) -> bool:
    stripped = line.rstrip(b"\r")
    return len(stripped) >= _RULE_MIN and stripped.strip(b"=") == b""


class _Held(enum.Enum):
    """What the filter is in: ordinary output, MPICH's banner (held back), or the lines after it."""

    NORMAL = "normal"
    BANNER = "banner"
    TRAILER = "trailer"


class MessageFilter:
    """Split one output stream into what passes now and MPICH's stop report, held apart.

    Example:
        >>> f = MessageFilter()
        >>> f.feed(b"step 1\\n\\n" + b"=" * 83 + b"\\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\\n")
        b'step 1\\n'
        >>> f.feed(b"=" * 83 + b"\\nYOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\\ndone\\n")
        b'done\\n'
        >>> len(f.held)
        5
    """

    def __init__(self) -> None:
        self.held: list[bytes] = []  # whole lines, newline included
        self._pending = b""  # bytes not yet decided
        self._candidates: list[bytes] = []  # a blank line and a rule that may open the banner
        self._state = _Held.NORMAL
        self._mid_line = False  # part of the current line already passed: the rest passes too
        self.hold_ctrl_c_notice = False  # the launcher sent mpiexec SIGINT itself: Hydra's notice is held

    def feed(self, data: bytes) -> bytes:
        """Take the next bytes read; returns the bytes to write now."""
        out: list[bytes] = []
        data = self._pending + data
        self._pending = b""
        while data:
            end = data.find(b"\n")
            if end < 0:
                break
            line, data = data[:end + 1], data[end + 1:]
            if self._mid_line:
                self._mid_line = False
                out.append(line)
                continue
            out.extend(self._line(line))
        if data:
            if self._mid_line or (self._state is _Held.NORMAL and not self._candidates
                                  and not any(data.startswith(p) or p.startswith(data) for p in _HOLD_PREFIXES)):
                self._mid_line = True
                out.append(data)
            else:
                self._pending = data
        return b"".join(out)

    def finish(self) -> bytes:
        """The stream ended: returns what was still undecided (never a held line)."""
        out = b"".join(self._candidates) + self._pending
        self._candidates, self._pending = [], b""
        return out

    def _line(self, line: bytes) -> list[bytes]:
        body = line.rstrip(b"\r\n")
        if self._state is _Held.BANNER:
            self.held.append(line)
            if _is_rule(body):
                self._state = _Held.TRAILER
            return []
        if self._state is _Held.TRAILER:
            if body.startswith(_TRAILER):
                self.held.append(line)
                return []
            self._state = _Held.NORMAL
        if self._candidates:
            has_rule = _is_rule(self._candidates[-1].rstrip(b"\r\n"))
            if has_rule and body.startswith(b"=   "):
                self.held.extend(self._candidates)
                self.held.append(line)
                self._candidates = []
                self._state = _Held.BANNER
                return []
            if not has_rule and _is_rule(body):
                self._candidates.append(line)
                return []
            out, self._candidates = self._candidates, []
            return out + self._line(line)
        if body == b"" or _is_rule(body):
            self._candidates.append(line)
            return []
        if _CLEANUP.match(body) or (self.hold_ctrl_c_notice and _CTRL_C_NOTICE.match(body)):
            self.held.append(line)
            return []
        return [line]


class OutputRelay:
    """Copy one pipe from mpiexec to `write` through a `MessageFilter`, in a thread of its own.

    With `tags` (mpiexec marks each rank's pieces with them) each rank's lines are written whole
    (`RankLines`), and mpiexec's own output goes through the filter.
    """

    def __init__(self, fd: int, write: Callable[[bytes], object], tags: RankTags | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.filter = MessageFilter()
        self.lines = RankLines(tags) if tags is not None else None
        self._fd, self._write, self._clock = fd, write, clock
        self._thread = threading.Thread(target=self._pump, name="unisonrun-output", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<OutputRelay fd={self._fd} held_lines={len(self.filter.held)} lines={self.lines!r}>"

    def _pass(self, pieces: Sequence[tuple[str | None, bytes]]) -> None:
        """Write the ranks' pieces as they are and mpiexec's own through the filter, in their order."""
        passed = b"".join(data if rank is not None else self.filter.feed(data) for rank, data in pieces)
        if passed:
            self._write(passed)

    def _readable(self, poller: select.poll) -> bool:
        """Wait for data, or until the first line held for its newline is due (then pass it)."""
        lines = self.lines
        due = lines.next_due() if lines is not None else None
        if lines is None or due is None:
            return True
        if poller.poll(max(0, math.ceil((due - self._clock()) * 1000))):
            return True
        self._pass(lines.due(self._clock()))
        return False

    def _pump(self) -> None:
        try:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            while True:
                if not self._readable(poller):
                    continue
                try:
                    data = os.read(self._fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                if self.lines is None:
                    self._pass([(None, data)])
                else:  # held lines come due while other ranks keep the pipe busy too
                    now = self._clock()
                    self._pass([*self.lines.feed(data, now), *self.lines.due(now)])
            if self.lines is not None:
                self._pass(self.lines.finish())
            rest = self.filter.finish()
            if rest:
                self._write(rest)
        finally:
            os.close(self._fd)

    def join(self, timeout_seconds: float) -> list[bytes]:
        """Wait up to `timeout_seconds` for the end of the stream; returns the lines held back."""
        self._thread.join(timeout_seconds)
        return list(self.filter.held)
