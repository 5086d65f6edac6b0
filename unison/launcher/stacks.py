"""The stacks of a running job's ranks, for `unisonrun --status`: asked for with SIGUSR2, read back.

Each rank unisonrun started on this host writes every thread's stack when it gets SIGUSR2
(`unison._job.stack_dump`, through `faulthandler`, so even a rank stuck in C code answers). This
module sends the signal to the ranks on this host that started and have not ended (their markers),
waits until each answer is complete, and shows each rank's main thread: where it is in the user's
code, then its frames, innermost first. Ranks on other hosts are named as out of reach. Reading the
answers (`main_thread_frames`) is pure.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from .._job.stack_dump import MAIN_THREAD_HEADER, SIGNAL, file_name
from ..engine.where import USER_FRAMES, internal
from .supervision.blame import read_markers
from .supervision.deaths import alive

__all__ = ["ask_stacks", "main_thread_frames", "stack_lines"]

_SETTLE_SECONDS = 0.2  # an answer that stopped growing this long is complete
_BLOCK = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')


def main_thread_frames(header: str, answer: str) -> list[tuple[str, int, str]]:
    """The main thread's frames, innermost first, in one faulthandler answer: (file, line, function).

    `header` is the file's first line (``main thread 0x...``); `answer` what the rank appended.

    Example:
        >>> answer = 'Thread 0x0000000000000002 (most recent call first):\\n  File "a.py", line 3 in f\\n\\n'
        >>> main_thread_frames("main thread 0x0000000000000002", answer)
        [('a.py', 3, 'f')]
    """
    main = header.removeprefix(MAIN_THREAD_HEADER).strip()
    frames: list[tuple[str, int, str]] = []
    inside = False
    for line in answer.splitlines():
        block = _BLOCK.match(line)
        if block:
            if inside:
                break
            inside = int(block.group(1), 16) == int(main, 16) if main.startswith("0x") else False
            continue
        match = _FRAME.match(line) if inside else None
        if match:
            frames.append((match["file"], int(match["line"]), match["name"]))
    return frames


def stack_lines(rank: int, host: str, pid: int, frames: Sequence[tuple[str, int, str]]) -> list[str]:
    """What --status prints of one rank's main thread: where it is in the user's code (its innermost user
    frames, as reports name a place), then every frame.

    Example:
        >>> stack_lines(1, "h", 9, [("/x/train.py", 5, "step"), ("/x/train.py", 9, "<module>")])[0]
        'rank 1 (h, pid 9): main thread at train.py:5 in step <- train.py:9 in <module>, innermost frame first:'
    """
    users = [frame for frame in frames if not internal(frame[0])][:USER_FRAMES]
    at = " at " + " <- ".join(f"{os.path.basename(path)}:{line} in {name}" for path, line, name in users) if users else ""
    lines = [f"rank {rank} ({host}, pid {pid}): main thread{at}, innermost frame first:"]
    lines += [f"    {path}:{line} in {name}" for path, line, name in frames]
    return lines


def ask_stacks(directory: Path, timeout: float = 3.0) -> list[str]:
    """Ask the running ranks of the launch in `directory` for their stacks; the lines to print."""
    markers = read_markers(directory)
    here = socket.gethostname()
    lines: list[str] = []
    asked: dict[int, tuple[str, int, Path, int]] = {}
    for rank, (host, pid) in sorted(markers.started.items()):
        if rank in markers.ended or rank in markers.finished:
            continue
        if host != here:
            lines.append(f"rank {rank} ({host}, pid {pid}): on another host; its stack is out of reach from here.")
            continue
        path = directory / file_name(rank)
        if not path.exists() or not alive(pid):
            continue
        size = path.stat().st_size
        try:
            os.kill(pid, SIGNAL)
        except (ProcessLookupError, PermissionError):
            continue
        asked[rank] = (host, pid, path, size)
    answers = _collect(asked, timeout)
    for rank, (host, pid, _, _) in sorted(asked.items()):
        header, answer = answers.get(rank, ("", ""))
        frames = main_thread_frames(header, answer)
        if frames:
            lines += stack_lines(rank, host, pid, frames)
        else:
            lines.append(f"rank {rank} ({host}, pid {pid}): no answer within {timeout:g} s (it handles SIGUSR2 "
                         "itself, or it is stopped).")
    return lines


def _collect(asked: dict[int, tuple[str, int, Path, int]], timeout: float) -> dict[int, tuple[str, str]]:
    """Each asked rank's (header, answer) once its file stopped growing, or what came by `timeout`."""
    deadline = time.monotonic() + timeout
    sizes = {rank: before for rank, (_, _, _, before) in asked.items()}
    changed = {rank: 0.0 for rank in asked}
    while asked and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.monotonic()
        for rank, (_, _, path, _) in asked.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size != sizes[rank]:
                sizes[rank], changed[rank] = size, now
        if all(sizes[rank] > asked[rank][3] and now - changed[rank] >= _SETTLE_SECONDS for rank in asked):
            break
    answers = {}
    for rank, (_, _, path, before) in asked.items():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        text = data.decode(errors="backslashreplace")
        answers[rank] = (text.splitlines()[0] if text else "", data[before:].decode(errors="backslashreplace"))
    return answers
