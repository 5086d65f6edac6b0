"""A failing rank's marker (unison/_job/failure.py over unison/_contract.py's `write_atomically`): any reason is
written and reads back, a file planted at the temporary name is never written through, and the abort
reaches the engine whatever happens to the marker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from unison import _contract
from unison._contract import write_atomically
from unison._job import failure as _failure

# What an exception built from an undecodable file name says: a lone surrogate.
UNDECODABLE = "cannot read " + os.fsdecode(b"\xe9")


class _Engine:
    state = "running"
    stop_error = None

    def __init__(self) -> None:
        self.aborts: list[str] = []

    def abort(self, reason: str, timeout_seconds: float) -> bool:
        self.aborts.append(reason)
        return True


@pytest.fixture
def failing_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Engine:
    """Rank 1 of 2 under unisonrun, its launcher directory `tmp_path`; the engine records the abort."""
    engine = _Engine()
    state = _failure._state
    for name, value in {"engine": engine, "rank": 1, "size": 2, "mpi": None, "host": "h", "launcher_dir": tmp_path,
                        "launcher_relay": "", "aborted_reason": "", "failure_recorded": False, "forked": False,
                        "exit_watch": None}.items():
        monkeypatch.setattr(state, name, value)
    return engine


def test_any_text_is_written_and_reads_back_as_the_launcher_reads_it(tmp_path: Path) -> None:
    target = tmp_path / "failed-0"
    write_atomically(target, UNDECODABLE + " é\n")
    # the launcher's read_markers reads with Path.read_text(): the locale's encoding, strict
    assert target.read_text() == "cannot read \\udce9 é\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed-0"]


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / ".failed-2.tmp").symlink_to(victim)
    (tmp_path / ".service.json.7").symlink_to(victim)
    write_atomically(tmp_path / "failed-2", "rank 2 failed\n")
    write_atomically(tmp_path / "service.json", "{}", temporary=tmp_path / ".service.json.7", mode=0o600)
    assert victim.read_text() == "keep me\n"
    assert (tmp_path / "failed-2").read_text() == "rank 2 failed\n" and not (tmp_path / "failed-2").is_symlink()
    assert (tmp_path / "service.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [".failed-2.tmp", ".service.json.7", "failed-2",
                                                         "service.json", "victim"]


def test_a_failed_write_leaves_no_temporary_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_replace(source: Any, target: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_contract.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(tmp_path / "failed-0", "x\n")
    assert list(tmp_path.iterdir()) == []


def test_an_undecodable_reason_is_marked_and_still_aborts_the_job(failing_rank: _Engine, tmp_path: Path) -> None:
    _failure.abort_job(ValueError(UNDECODABLE))
    assert failing_rank.aborts == [f"rank 1 (h, pid {os.getpid()}) failed: ValueError: {UNDECODABLE}"]
    assert (tmp_path / "failed-1").read_text() == f"rank 1 (h, pid {os.getpid()}) failed: ValueError: cannot read \\udce9\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed-1"]


def test_a_marker_that_cannot_be_written_does_not_stop_the_abort(
        failing_rank: _Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken_write(path: Any, data: Any, **kwargs: Any) -> None:
        raise RuntimeError("the disk said no")

    monkeypatch.setattr(_failure, "write_atomically", broken_write)
    _failure.abort_job(ValueError("boom"))
    assert failing_rank.aborts == [f"rank 1 (h, pid {os.getpid()}) failed: ValueError: boom"]
    assert "rank 1 could not leave its failed-1 marker for the launcher: RuntimeError: the disk said no" in caplog.text


def test_the_launcher_reads_a_marker_that_is_not_text_in_its_encoding(tmp_path: Path) -> None:
    from unison.launcher.supervision.blame import read_markers

    (tmp_path / "failed-3").write_bytes(b"rank 3 failed: \xff\xfe bytes\n")
    assert read_markers(tmp_path).failed == {3: "rank 3 failed: \\xff\\xfe bytes"}
