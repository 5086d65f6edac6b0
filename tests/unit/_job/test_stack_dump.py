"""SIGUSR2 makes a rank under unisonrun write its stacks; a program's own SIGUSR2 handler is left alone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from unison._job import stack_dump
from unison.launcher.stacks import main_thread_frames


def test_the_signal_writes_the_main_thread_s_stack_after_a_line_that_names_it(tmp_path: Path) -> None:
    if signal.getsignal(stack_dump.SIGNAL) is not signal.SIG_DFL:
        pytest.skip("this process handles SIGUSR2 itself")
    stack_dump.arm(tmp_path, 3)
    try:
        path = tmp_path / "stacks-3.txt"
        header = path.read_text().splitlines()[0]
        os.kill(os.getpid(), stack_dump.SIGNAL)
        deadline = time.monotonic() + 5
        while path.stat().st_size <= len(header) + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        frames = main_thread_frames(header, path.read_text().split("\n", 1)[1])
        assert frames and frames[0][2] == "test_the_signal_writes_the_main_thread_s_stack_after_a_line_that_names_it"
        assert (path.stat().st_mode & 0o777) == 0o600
    finally:
        stack_dump.disarm()
    assert signal.getsignal(stack_dump.SIGNAL) is signal.SIG_DFL


def test_a_program_s_own_handler_is_kept(tmp_path: Path) -> None:
    previous = signal.signal(stack_dump.SIGNAL, lambda signum, frame: None)
    try:
        stack_dump.arm(tmp_path, 0)
        assert not (tmp_path / "stacks-0.txt").exists()
    finally:
        signal.signal(stack_dump.SIGNAL, previous)
        stack_dump.disarm()


def test_nothing_is_armed_without_a_launcher_directory() -> None:
    stack_dump.arm(None, 0)
    assert not stack_dump._armed
