"""Bad input to init_process_group("unison", ...) is a clear error on every process, within the timeout, and
leaves nothing half-started: ranks that never arrive, a world size that differs, two processes claiming one
rank, an init_method nobody serves, a second init_process_group (real processes, started by hand). Also what
``hvd.mpi_threads_supported()`` says in such a job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HERE, ROOT, clean_env, free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

MEET = str(HERE / "_meet.py")


def meet(init_method: str, ranks: list[tuple[int, int]], seconds: float = 5.0, *extra: str) -> list[str]:
    """Start one `_meet.py` per (rank, world size) at once; each one's output, in the order given."""
    procs = [subprocess.Popen([sys.executable, MEET, init_method, str(rank), str(size), str(seconds), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=clean_env())
             for rank, size in ranks]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=90)[0])
        finally:
            proc.kill()
    return outputs


def error_of(output: str) -> tuple[float, str]:
    """(seconds until the error, 'Type: message') of one process, which must not have started unison."""
    found = re.search(r"^error after ([\d.]+) s: (.*)$", output, re.M)
    assert found, output[-3000:]
    assert "initialized=False" in output, output[-3000:]
    return float(found.group(1)), found.group(2)


def test_ranks_that_never_arrive_are_named_within_the_timeout(tmp_path: Path) -> None:
    for output in meet(f"file://{tmp_path / 'rendezvous'}", [(0, 3), (1, 3)], 4.0):
        seconds, error = error_of(output)
        assert error.startswith("StartupError: init() failed: rank 2 did not reach init() within 4 s"), error
        assert "the timeout of init_process_group" in error
        assert seconds < 15


def test_a_missing_rank_over_tcp_is_told_on_every_rank_within_the_timeout() -> None:
    """Over tcp:// rank 0 waits in torch's rendezvous for every process to connect to its store: torch's error
    says how many came, and the others learn why rank 0's store went away."""
    first, second = meet(f"tcp://127.0.0.1:{free_port()}", [(0, 3), (1, 3)], 4.0)
    seconds, error = error_of(first)
    assert "2/3 clients joined" in error and seconds < 15, error
    seconds, error = error_of(second)
    assert error.startswith("StartupError: init() failed: the store the ranks meet at stopped answering"), error
    assert "Rank 0 never reached unison's start" in error and seconds < 20


@pytest.mark.parametrize("scheme", ["file", "tcp"])
def test_a_world_size_that_differs_is_named_on_every_rank(tmp_path: Path, scheme: str) -> None:
    where = f"file://{tmp_path / 'rendezvous'}" if scheme == "file" else f"tcp://127.0.0.1:{free_port()}"
    for output in meet(where, [(0, 2), (1, 3)]):
        _, error = error_of(output)
        assert error.startswith("StartupError: init() failed: the world size differs between ranks: 2 on rank "
                                "[0]; 3 on rank [1]. Pass the same world_size"), error


def test_two_processes_claiming_one_rank_are_refused() -> None:
    outputs = meet(f"tcp://127.0.0.1:{free_port()}", [(0, 2), (1, 2), (1, 2)])
    refused = [output for output in outputs if "error after" in output]
    assert len(refused) == 1, outputs  # the second claimant; the first and rank 0 make the job of two
    _, error = error_of(refused[0])
    assert re.match(r"StartupError: init\(\) failed: two processes claim rank 1: .*, pid \d+ came first, this one "
                    r"\(.*, pid \d+\) second\. Give each process its own rank", error), error
    assert sum("joined" in output and "initialized=True" in output for output in outputs) == 2, outputs


def test_an_init_method_nobody_serves_is_named_within_the_timeout() -> None:
    port = free_port()
    seconds, error = error_of(meet(f"tcp://127.0.0.1:{port}", [(1, 2)], 3.0)[0])
    assert f"(127.0.0.1, {port})" in error and seconds < 15, error


def test_a_second_init_process_group_is_refused_and_the_job_runs_on(tmp_path: Path) -> None:
    for output in meet(f"file://{tmp_path / 'rendezvous'}", [(0, 2), (1, 2)], 5.0, "twice"):
        assert "ValueError: trying to initialize the default process group twice!" in output, output[-3000:]
        assert "initialized=True" in output  # the first one's job is untouched


def test_mpi_threads_supported_says_what_the_job_is(tmp_path: Path) -> None:
    for output in meet(f"file://{tmp_path / 'rendezvous'}", [(0, 2), (1, 2)], 5.0, "probe"):
        assert ("mpi_threads_supported: ValueError: MPI is not in use in this job: its 2 processes met at a torch "
                "store and run on gloo.") in output, output[-3000:]
        assert "gloo_enabled: True mpi_enabled: False" in output


def test_a_rank_of_an_mpi_launch_keeps_it_and_a_contradicting_rank_is_named(tmp_path: Path) -> None:
    """Under mpiexec each process is already a rank of a unison job: init_process_group's rank and world
    size must be the job's, and a contradiction names both."""
    from unison.testing.run import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "swap.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\nimport unison.torch as hvd\n"
        "rank = int(os.environ['PMI_RANK'])\n"
        f"try:\n    dist.init_process_group('unison', init_method='file://{tmp_path / 'rendezvous'}', "
        "rank=1 - rank, world_size=2)\nexcept Exception as exc:\n"
        "    print(f'error: {type(exc).__name__}: {exc}', flush=True)\n"
        "print(f'unison rank {hvd.rank()} of {hvd.size()}', flush=True)\n")
    env = clean_env()
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert (f"error: InvalidArgumentError: init_process_group('unison') was given rank={1 - rank}, world_size=2, "
                f"but this process is rank {rank} of 2 in its unison job (started by unisonrun, mpiexec or srun)"
                ) in done.stdout, done.stdout
        assert f"unison rank {rank} of 2" in done.stdout  # the job it had is kept
