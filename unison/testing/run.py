"""Run pytest as N ranks under mpiexec with the lockstep plugin, one log per rank, and report each rank's outcome.

Usage: python -m unison.testing.run -n N [--torchrun] [--job-timeout SECONDS] [pytest args...]

Runs ``mpiexec -n N python -m pytest -p unison.testing.pytest_plugin -p no:cacheprovider [pytest
args...]`` in the current directory, each rank writing its output to its own log. When the job ends,
rank 0's log is printed in full, followed by the log of every other rank that failed. The exit status
is 0 only if mpiexec succeeded and every rank passed, or if no rank collected any test. A job still
running after --job-timeout (900 s) is terminated: SIGTERM to mpiexec, which forwards it to the ranks
(they dump their stacks), then SIGKILL to whatever is left. With --torchrun the ranks are started by
torchrun (``python -m torch.distributed.run --standalone``) instead, without MPI: the plugin's
barrier then meets over torch's store.

Example:
    $ python -m unison.testing.run -n 2 tests/mpi -k allreduce
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

NO_TESTS_COLLECTED = 5
# The ranks cannot share pytest's cache directory.
PYTEST_OPTIONS = ("-p", "unison.testing.pytest_plugin", "-p", "no:cacheprovider")
# pytest's closing line ("=== 1 failed, 2 passed in 0.1s ==="), a pytest-timeout dump, a harness abort.
_FAILURE_IN_LOG = re.compile(
    r"^(=+ )?.*\b\d+ (failed|errors?)\b.* in [\d.]+s|^\++ Timeout \++$|^FATAL \(rank \d+\)", re.MULTILINE
)


def find_mpiexec() -> str | None:
    """The mpiexec beside this Python (the mpich wheel's, matching the MPI mpi4py loads), else the first
    on PATH (an MPI installed elsewhere, e.g. with ``pip install --prefix``); None when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def _mpiexec() -> str:
    found = find_mpiexec()
    if found is None:
        sys.exit("mpiexec not found: install the mpi extra (pip install -e '.[mpi]') or a system MPI")
    return found


def _descendants(pid: int) -> list[int]:
    """Return the ids of all processes below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return found


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """End mpiexec and every process it started, politely first."""
    # The ranks run in sessions of their own (hydra calls setsid), so one killpg does not reach them.
    stragglers = _descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    time.sleep(1)
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _exit_status(path: Path) -> int | None:
    text = _read(path).strip()
    return int(text) if text else None


def _show(title: str, text: str) -> None:
    print(f"===== {title} =====")
    print(text if text.endswith("\n") or not text else text + "\n", end="")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the job; return 0 if every rank passed (or none collected a test), 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m unison.testing.run", allow_abbrev=False,
        usage="%(prog)s -n N [--torchrun] [--job-timeout SECONDS] [pytest args...]",
    )  # fmt: skip
    parser.add_argument("-n", dest="processes", type=int, required=True, help="number of ranks")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds before the job is killed")
    parser.add_argument("--torchrun", action="store_true", help="start the ranks with torchrun instead of mpiexec")
    options, pytest_args = parser.parse_known_args(argv)
    if options.processes < 1:
        parser.error(f"-n must be at least 1. Got -n {options.processes}.")

    logdir = Path(tempfile.mkdtemp(prefix="unison-multirank-"))
    rank_command = [sys.executable, "-m", "unison.testing._rank_wrapper", str(logdir),
                    "-m", "pytest", *PYTEST_OPTIONS, *pytest_args]
    launcher, environment = "mpiexec", None
    if options.torchrun:
        launcher = "torchrun"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   str(options.processes), "--no-python", *rank_command]
    else:
        command = [_mpiexec(), "-n", str(options.processes), *rank_command]
    print(f"$ {' '.join(command)}", flush=True)
    started = time.monotonic()
    with open(logdir / f"{launcher}.log", "wb") as mpiexec_log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=mpiexec_log, stderr=subprocess.STDOUT,
            start_new_session=True, env=environment,
        )  # fmt: skip
        timed_out = False
        try:
            returncode = process.wait(timeout=options.job_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _terminate(process)
            returncode = process.returncode
    elapsed = time.monotonic() - started

    statuses = {rank: _exit_status(logdir / f"rank-{rank}.exit") for rank in range(options.processes)}
    logs = {rank: _read(logdir / f"rank-{rank}.log") for rank in range(options.processes)}
    if all(status == NO_TESTS_COLLECTED for status in statuses.values()) and not timed_out:
        _show("rank 0", logs[0])
        print("no tests collected")
        shutil.rmtree(logdir, ignore_errors=True)
        return 0

    failed = [
        rank for rank, status in statuses.items()
        if status != 0 or _FAILURE_IN_LOG.search(logs[rank])
    ]  # fmt: skip
    _show("rank 0", logs[0])
    for rank in failed:
        if rank != 0:
            _show(f"rank {rank}", logs[rank])
    problems = []
    if timed_out:
        problems.append(
            f"the job was still running after {options.job_timeout:g} s and was killed "
            f"({launcher} got SIGTERM, then SIGKILL for any process left)"
        )
    if returncode != 0:
        problems.append(f"{launcher} exited with status {returncode}")
    if failed:
        described = ", ".join(
            f"rank {rank} ({'no exit status: aborted or killed' if statuses[rank] is None else f'exit {statuses[rank]}'})"
            for rank in failed
        )
        problems.append(f"failures on {described}")
    mpiexec_output = _read(logdir / f"{launcher}.log")
    if problems and mpiexec_output.strip():
        _show(launcher, mpiexec_output)

    where = f"pytest on {options.processes} ranks ({elapsed:.1f} s)"
    if problems:
        print(f"FAILED {where}: {'; '.join(problems)}. Logs: {logdir}")
        return 1
    print(f"passed {where}")
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
