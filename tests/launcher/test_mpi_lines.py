"""Each rank's lines whole under unisonrun although MPICH's mpiexec interleaves the ranks' pieces: the
reassembly's decisions on marked streams as Hydra writes them, the relay's hold, then real jobs."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from faults._jobs import PYTHON, run_job, unisonrun

from unison.launcher.mpi.lines import HOLD_SECONDS, RankLines, RankTags, rank_tags
from unison.launcher.mpi.messages import OutputRelay

pytestmark = pytest.mark.timeout(120)

PROGRAM = str(Path(__file__).resolve().parent / "_lines_program.py")
TAGS = RankTags(b"0123456789ab")
M0, M1 = TAGS.marker(0), TAGS.marker(1)
BANNER = b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n" + b"=" * 83 + b"\n"


def _written(pieces: list[tuple[str | None, bytes]]) -> bytes:
    return b"".join(data for _, data in pieces)


def test_markers_for_mpich_only_and_never_twice() -> None:
    assert rank_tags("mpich", "", ["-disable-auto-cleanup"]) is not None
    assert rank_tags("openmpi", "", []) is None
    assert rank_tags("mpich", "/out", []) is None  # mpiexec writes files: Hydra would put markers in them
    for own in (["-l"], ["-prepend-rank"], ["--prepend-pattern", "[%r] "], ["-outfile-pattern=o.%r"]):
        assert rank_tags("mpich", "", own) is None, own  # Hydra refuses a second pattern
    a, b = RankTags.new(), RankTags.new()
    assert a.token != b.token and a.pattern == a.start.decode() + "%r\x1f"


# What Hydra wrote for two ranks printing with PYTHONUNBUFFERED=1: the text, then the newline.
INTERLEAVED = M1 + b"rank 1 line 0" + M0 + b"rank 0 line 0" + M1 + b"\n" + M0 + b"\n"


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_a_line_written_in_two_pieces_comes_out_whole_whatever_the_reads(size: int) -> None:
    lines = RankLines(TAGS)
    chunks = [INTERLEAVED[i:i + size] for i in range(0, len(INTERLEAVED), size)]
    out = _written([piece for chunk in chunks for piece in lines.feed(chunk, now=0.0)]) + _written(lines.finish())
    assert out == b"rank 1 line 0\nrank 0 line 0\n"
    assert lines.statistics() == {"joined": 2, "passed_in_part": 0}


def test_complete_lines_pass_at_once_and_mpiexecs_own_output_is_told_apart() -> None:
    lines = RankLines(TAGS)
    stream = M0 + b"a\n" + M0 + b"\n" + M0 + b"b\n" + BANNER + b"[mpiexec@vm] cleanup\n" + M1 + b"c\n"
    assert lines.feed(stream, now=0.0) == [("0", b"a\n"), ("0", b"\n"), ("0", b"b\n"),
                                           (None, BANNER + b"[mpiexec@vm] cleanup\n"), ("1", b"c\n")]
    assert lines.next_due() is None and lines.finish() == []


def test_a_line_without_newline_waits_for_the_hold_then_the_rest_passes_as_it_comes() -> None:
    lines = RankLines(TAGS)
    assert lines.feed(M0 + b"\r 10%", now=1.0) == []
    assert lines.next_due() == pytest.approx(1.0 + HOLD_SECONDS)
    assert lines.due(now=1.0 + HOLD_SECONDS / 2) == []
    assert lines.feed(M1 + b"other\n", now=1.01) == [("1", b"other\n")]  # another rank's line does not wait
    assert lines.due(now=1.0 + HOLD_SECONDS) == [("0", b"\r 10%")]  # a progress bar still shows
    assert lines.feed(M0 + b"\r 20%", now=1.2) == [("0", b"\r 20%")]
    assert lines.feed(M0 + b"\r100%\n" + M0 + b"next", now=1.3) == [("0", b"\r100%\n")]
    assert lines.finish() == [("0", b"next")]  # nothing is lost at the end


def test_bytes_that_only_look_like_a_marker_are_the_ranks_own() -> None:
    lines = RankLines(TAGS)
    fake = TAGS.start + b"x\x1f"
    assert _written(lines.feed(M0 + b"a " + fake + b" b\n", now=0.0)) == b"a " + fake + b" b\n"
    assert _written(lines.feed(TAGS.start[:3], now=0.0)) == b""  # maybe a marker cut by the read
    assert _written(lines.feed(b"no\n", now=0.0)) == TAGS.start[:3] + b"no\n"


def test_the_relay_writes_a_held_line_after_the_hold_and_everything_at_the_end() -> None:
    read_fd, write_fd = os.pipe()
    written: list[tuple[float, bytes]] = []
    relay = OutputRelay(read_fd, lambda data: written.append((time.monotonic(), data)), TAGS)
    start = time.monotonic()
    os.write(write_fd, M0 + b"10%")
    deadline = time.monotonic() + 10
    while not written and time.monotonic() < deadline:
        time.sleep(0.005)
    assert written and written[0][1] == b"10%"
    assert HOLD_SECONDS <= written[0][0] - start < HOLD_SECONDS + 2.0
    os.write(write_fd, M1 + b"held" + M0 + b" done\n" + b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION\n")
    os.close(write_fd)
    assert relay.join(10) == [b"\n", b"=" * 83 + b"\n", b"=   BAD TERMINATION\n"]  # MPICH's own report, held
    assert b"".join(data for _, data in written) == b"10% done\nheld"


def test_ranks_lines_stay_whole_under_unisonrun_with_unbuffered_python(tmp_path: Path) -> None:
    # Each round, rank 0's whole line comes between rank 1's text and its newline: plain mpiexec
    # writes `rank 1 round N xxx...rank 0 round N yyy...` and then an empty line.
    done = run_job(unisonrun("-np", "2", PYTHON, PROGRAM, str(tmp_path), "10"),
                   env={"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.output
    lines = done.output.splitlines()
    glued = [line for line in lines if line.count("rank") > 1]
    assert not glued and "" not in lines, done.output
    for number in range(10):
        assert f"rank 1 round {number} " + "x" * 60 in lines, done.output
        assert f"rank 0 round {number} " + "y" * 60 in lines, done.output
    for rank in (0, 1):
        assert sum(1 for line in lines if re.fullmatch(rf"rank {rank} line \d+ z{{80}}", line)) == 100, done.output
