"""An error that ends one rank started by torch.multiprocessing.spawn is named by the ranks it stops.

spawn's wrapper catches what escapes the spawned function and ends the process with ``sys.exit(1)``,
and the parent shows the traceback of the first process that ended: that must name the error whichever
rank it is, and the other ranks must not take the failed rank's exit for a ``shutdown()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import clean_env, free_port, run

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

# Rank 1 raises at step 2 while rank 0 goes on into the step's allreduce (DDP's backward) and waits
# there for rank 1: rank 0's error is the job's stop, every time. Each rank writes OUT/error-R.
_PROGRAM = '''
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, out, where):
    import unison.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("unison", init_method=f"tcp://{where}", rank=rank, world_size=2)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    try:
        for step in range(5):
            if step == 2 and rank == 1:
                raise ValueError("rank 1 bad batch")
            ddp(torch.randn(3, 4)).sum().backward()
    except Exception as exc:
        (Path(out) / f"error-{rank}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2)
'''


def test_a_rank_that_raises_under_mp_spawn_is_named_by_the_rank_it_stops(tmp_path: Path) -> None:
    program = tmp_path / "spawned.py"
    program.write_text(_PROGRAM)
    done = run([str(program), str(tmp_path), f"127.0.0.1:{free_port()}"], clean_env(), cwd=tmp_path)
    assert done.returncode != 0
    reported = done.stderr[done.stderr.rfind("-- Process "):]
    assert "terminated with the following error" in reported, done.stderr[-3000:]
    assert "rank 1 bad batch" in reported, done.stderr[-3000:]  # whichever process spawn reports
    assert (tmp_path / "error-1").read_text() == "ValueError: rank 1 bad batch"
    stopped = (tmp_path / "error-0").read_text()
    assert "AbortedError: rank 1 (" in stopped, (stopped, done.stderr[-3000:])
    assert "failed: ValueError: rank 1 bad batch at spawned.py:" in stopped, (stopped, done.stderr[-3000:])
    assert "called shutdown()" not in stopped, (stopped, done.stderr[-3000:])
    # rank 1 says what it stops the job for (its traceback is spawn's to show)
    assert "unison: rank 1 (" in done.stderr and "; stopping every rank." in done.stderr, done.stderr[-3000:]


def test_outside_mp_spawn_sys_exit_is_left_alone() -> None:
    import torch.multiprocessing  # noqa: F401 - loads spawn's wrapper, which this process does not run in

    from unison._job.torch_launch import on_spawned_failure, spawned_by_torch

    before = sys.exit
    assert not spawned_by_torch()
    assert on_spawned_failure(lambda exc: None) is False
    assert sys.exit is before
