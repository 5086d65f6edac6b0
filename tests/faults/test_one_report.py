"""One report per failure: a DDP rank that issues one extra all_reduce (examples/pytorch_ddp_digits.py
--desync) is reported once, by unisonrun or (plain mpiexec) rank 0, and every other rank says in one
line where it stopped and who reports it. Before, the same message came 46 to 53 times in 53 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._jobs import MPIEXEC, PYTHON, run_job, unisonrun

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(180)]

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch_ddp_digits.py")
MESSAGE = "Mismatched ALLREDUCE tensor shapes for 'allreduce.torch.pg."
# The engine's own log of the abort's reason (one line per rank at most): not part of the report's count.
ENGINE_LOG = re.compile(r"^\S+ \S+ \[unison rank \d+/\d+ \S+\] ERROR ")
SOURCE = Path(EXAMPLE).read_text().splitlines()


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(SOURCE, 1) if text in line)


EXTRA = line_of("dist.all_reduce(torch.ones(3")  # rank 1's extra all_reduce
COMMON = line_of("dist.all_reduce(total)")  # every rank's
MAIN = line_of("    main()")  # the call of main() at the end


def failure_lines(output: str, ranks: int) -> list[str]:
    """The non-blank lines of a run that are about its failure (the epochs' lines left out)."""
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("epoch ")]
    logged = [line for line in lines if ENGINE_LOG.match(line)]
    assert len(logged) <= ranks, lines
    return [line for line in lines if not ENGINE_LOG.match(line)]


def note(rank: int, line: int, reporter: str) -> re.Pattern[str]:
    return re.compile(rf"^\[rank{rank}\]: unison: rank {rank} \([^)]*\) stopped at pytorch_ddp_digits\.py:{line} in "
                      rf"main <- pytorch_ddp_digits\.py:{MAIN} in <module>: MismatchError, raised on every rank of "
                      rf"the collective; {reporter} reports it\.$")


@pytest.mark.parametrize("n", [2, 3])
def test_unisonrun_reports_a_ddp_desync_once_and_names_the_extra_call_first(n: int) -> None:
    done = run_job(unisonrun("-np", str(n), PYTHON, EXAMPLE, "--epochs", "3", "--desync"), deadline=150)
    assert done.returncode == 1, done.output
    lines = failure_lines(done.output, n)
    ours = [line for line in lines if line.startswith("unisonrun:")]
    # Every rank: one line; unisonrun: the message once, then each rank's call, rank 1's extra one first.
    assert len(lines) == n + 1 + n, done.output
    for rank in range(n):
        assert sum(bool(note(rank, EXTRA if rank == 1 else COMMON, "unisonrun").match(x)) for x in lines) == 1, lines
    assert ours[0].startswith("unisonrun: ranks 1, " if n == 3 else "unisonrun: ranks 1 and 0 raised one MismatchError: ")
    assert ours[1].startswith("unisonrun:   rank 1 (") and ours[1].endswith(
        f" at pytorch_ddp_digits.py:{EXTRA} in main <- pytorch_ddp_digits.py:{MAIN} in <module>"), ours
    assert all(f"pytorch_ddp_digits.py:{COMMON} in main" in x for x in ours[2:]), ours
    assert done.output.count(MESSAGE) - sum(MESSAGE in x for x in done.output.splitlines() if ENGINE_LOG.match(x)) == 1
    assert "Traceback" not in done.output, done.output
    # the message names both calls, as the example's docstring says
    others = "rank [0]" if n == 2 else "ranks [0, 2]"
    assert (f"Called at pytorch_ddp_digits.py:{COMMON} in main <- pytorch_ddp_digits.py:{MAIN} in <module> on {others}; "
            f"pytorch_ddp_digits.py:{EXTRA} in main <- pytorch_ddp_digits.py:{MAIN} in <module> on rank [1].") in ours[0]


def test_under_plain_mpiexec_rank_0_reports_a_ddp_desync_and_rank_1_points_to_it() -> None:
    done = run_job([MPIEXEC, "-n", "2", PYTHON, EXAMPLE, "--epochs", "3", "--desync"], deadline=150)
    assert done.returncode == 1, done.output
    lines = failure_lines(done.output, 2)
    # Rank 0: its traceback, without unison's frames, and its line; rank 1: one line.
    assert [x for x in lines if not x.startswith("[rank0]: ")] == [
        x for x in lines if note(1, EXTRA, "rank 0").match(x)], done.output
    rank0 = [x.removeprefix("[rank0]: ") for x in lines if x.startswith("[rank0]: ")]
    assert rank0[0] == "Traceback (most recent call last):" and rank0.count("Traceback (most recent call last):") == 1
    files = [x for x in rank0 if x.lstrip().startswith('File "')]
    assert files and not any("/unison/" in x for x in files), rank0
    assert f"line {COMMON}, in main" in "".join(files), rank0
    assert rank0[-2].startswith("unison.errors.MismatchError: " + MESSAGE), rank0
    assert re.match(rf"^unison: rank 0 \([^)]*\) stopped at pytorch_ddp_digits\.py:{COMMON} in main <- "
                    rf"pytorch_ddp_digits\.py:{MAIN} in <module>: MismatchError, raised on every rank of the collective; "
                    r"stopping every rank\.$", rank0[-1]), rank0
    # Besides the frames of the traceback (the user's and torch's: 4 to 6 here, as torch wraps wait()),
    # 4 lines: the traceback's header and error, rank 0's line, rank 1's line (51 lines in all before).
    assert len([x for x in lines if not x.startswith("[rank0]:   ")]) == 4, done.output
