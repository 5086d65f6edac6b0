"""Where every rank is, and what it last submitted: the reports of a stall, a deadlock and a mismatch name
each rank's line in the user's code (a torch call by what made it: DDP bucket 0), and each rank's flight
record of its last collectives is written, named, and read back side by side; under unisonrun, plain
mpiexec and torchrun (real processes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._jobs import HERE, MPIEXEC, PYTHON, SCENARIO, assert_no_strays, run_job, unisonrun

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(180)]

STALL_ENV = {"UNISON_STALL_CHECK_TIME_SECONDS": "1", "UNISON_STALL_SHUTDOWN_TIME_SECONDS": "2"}
DDP_SCENARIO = str(HERE / "_ddp_scenario.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def line_of(script: str, text: str) -> int:
    return next(number for number, line in enumerate(Path(script).read_text().splitlines(), 1) if text in line)


STEP = line_of(SCENARIO, 'hvd.allreduce(np.ones(4), name=f"grad.{step % 4}")')  # every rank's
METRIC = line_of(SCENARIO, "hvd.allreduce(np.ones(1))")  # rank 1's extra, unnamed
SLEEP = line_of(SCENARIO, "time.sleep(120)")  # rank 1 stuck in its own code
DDP_STEP = line_of(DDP_SCENARIO, "model(torch.randn(16, 8)).sum().backward()")
DDP_EXTRA = line_of(DDP_SCENARIO, "dist.all_reduce(torch.ones(5))")
DDP_SLEEP = line_of(DDP_SCENARIO, "time.sleep(120)")


def launch(launcher: str, *args: str) -> list[str]:
    if launcher == "unisonrun":
        return unisonrun("-np", "2", PYTHON, *args)
    if launcher == "torchrun":
        return [*TORCHRUN, *args]
    return [MPIEXEC, "-n", "2", PYTHON, *args]


def environment(launcher: str, extra: dict[str, str]) -> dict[str, str]:
    if launcher == "torchrun":
        pytest.importorskip("torch")
        if any(k.startswith(("PMI_", "OMPI_", "UNISON_LAUNCHER")) for k in os.environ):
            pytest.skip("torchrun's ranks would take this process's MPI or launcher variables for theirs")
    return extra


def records_of(output: str, launcher: str) -> Path:
    """The directory the job's report names for the flight records."""
    pattern = (r"each rank's last collectives are in (\S+);" if launcher == "unisonrun"
               else r"unison: each rank's last collectives are in (\S+) \(")
    match = re.search(pattern, output)
    assert match, output
    return Path(match.group(1))


def read_records(directory: Path) -> str:
    done = subprocess.run([PYTHON, "-m", "unison.launcher.flight", str(directory)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("launcher", ["unisonrun", "mpiexec", "torchrun"])
def test_a_deadlock_names_where_each_rank_waits_and_the_records_show_where_they_diverge(tmp_path: Path,
                                                                                      launcher: str) -> None:
    # Rank 1 alone calls an unnamed allreduce and waits in it; rank 0 waits in the next step's.
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "metric", "1"),
                   env=environment(launcher, {}), deadline=120)
    assert done.returncode != 0, done.output
    assert (f"rank 0 waits for allreduce.grad.3; has not submitted allreduce.noname.1 (unnamed allreduce #1); "
            f"its main thread waits at _scenario.py:{STEP} in <module>") in done.output, done.output
    assert (f"rank 1 waits for allreduce.noname.1 (unnamed allreduce #1); has not submitted allreduce.grad.3; "
            f"its main thread waits at _scenario.py:{METRIC} in <module>") in done.output, done.output
    # the report once: unisonrun's (rank 0 leaves it to unisonrun), else rank 0's log; torchrun repeats its
    # Root Cause's error file, rank 0's, which carries the report
    ranks_output, _, summary = done.output.partition("Root Cause (first observed failure):")
    assert ranks_output.count("rank 0 waits for allreduce.grad.3;") == 1, done.output
    assert summary.count("rank 0 waits for allreduce.grad.3;") == (launcher == "torchrun"), done.output
    records = records_of(done.output, launcher)
    assert sorted(path.name for path in records.glob("flight-*.json")) == ["flight-0.json", "flight-1.json"]
    shown = read_records(records)
    assert "the last 3 collectives every rank ran (oldest first):" in shown, shown
    assert re.search(rf"^  rank 0: allreduce\.grad\.3 \[4\] float64, pending [\d.]+ s, at _scenario\.py:{STEP} "
                     r"in <module>$", shown, re.M), shown
    assert re.search(rf"^  rank 1: allreduce\.noname\.1 \[1\] float64, pending [\d.]+ s, at _scenario\.py:{METRIC} "
                     r"in <module>$", shown, re.M), shown
    if launcher != "torchrun":
        assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize(("launcher", "controller"), [("unisonrun", "mpi"), ("mpiexec", "mpi"), ("unisonrun", "grpc")])
def test_a_stall_names_where_the_missing_rank_is_and_where_the_others_wait(tmp_path: Path, launcher: str,
                                                                          controller: str) -> None:
    # with the gRPC control plane every cycle gathers the rows, and rank 0's row asks for the places
    done = run_job(launch(launcher, SCENARIO, str(tmp_path), "stuck", "1"),
                   env={**STALL_ENV, "UNISON_CONTROLLER": controller}, deadline=90)
    assert done.returncode != 0, done.output
    assert re.search(r"rank 1 has not submitted: allreduce\.grad\.3 \(waiting [\d.]+ s, submitted by ranks \[0\]\); "
                     rf"its main thread is at _scenario\.py:{SLEEP} in <module>", done.output), done.output
    assert f"rank 0: its main thread waits at _scenario.py:{STEP} in <module>" in done.output, done.output
    assert "innermost frame first" not in done.output  # stacks only on request
    # each rank's own line says where it stopped and what happened in a few words (not the report's title)
    reporter = "unisonrun" if launcher == "unisonrun" else "rank 0"
    for rank, line in ((0, STEP), (1, SLEEP)):
        assert re.search(rf"^unison: rank {rank} \([^)]*\) stopped at _scenario\.py:{line} in <module>: StallError: the "
                         rf"job stalled; {reporter} reports it\.$", done.output, re.M), done.output
    assert_no_strays(tmp_path, 2)


def test_on_request_a_stall_report_lists_each_named_rank_s_stack(tmp_path: Path) -> None:
    done = run_job(launch("unisonrun", SCENARIO, str(tmp_path), "stuck", "1"),
                   env={**STALL_ENV, "UNISON_STALL_STACKS": "1"}, deadline=90)
    assert done.returncode != 0, done.output
    for rank, line in ((1, SLEEP), (0, STEP)):
        stack = done.output.split(f"rank {rank}'s main thread, innermost frame first:\n", 1)
        assert len(stack) == 2, done.output
        assert stack[1].splitlines()[0] == f"    _scenario.py:{line} in <module>", done.output
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["unisonrun", "mpiexec"])
def test_a_ddp_stall_names_the_bucket_and_where_the_stuck_rank_is(tmp_path: Path, launcher: str) -> None:
    pytest.importorskip("torch")
    done = run_job(launch(launcher, DDP_SCENARIO, str(tmp_path), "stuck", "1"), env=STALL_ENV, deadline=120)
    assert done.returncode == 1, done.output
    assert re.search(r"rank 1 has not submitted: allreduce\.torch\.pg\.p\d+\.\d+ \(DDP bucket 0; waiting [\d.]+ s, "
                     rf"submitted by ranks \[0\]\); its main thread is at _ddp_scenario\.py:{DDP_SLEEP} in <module>",
                     done.output), done.output
    assert f"rank 0: its main thread is at _ddp_scenario.py:{DDP_STEP} in <module>" in done.output, done.output
    assert_no_strays(tmp_path, 2)


@pytest.mark.parametrize("launcher", ["unisonrun", "mpiexec"])
def test_a_ddp_mismatch_names_each_rank_s_call_and_what_made_it(tmp_path: Path, launcher: str) -> None:
    pytest.importorskip("torch")
    done = run_job(launch(launcher, DDP_SCENARIO, str(tmp_path), "extra", "1"), env=STALL_ENV, deadline=120)
    assert done.returncode == 1, done.output
    assert re.search(r"Mismatched ALLREDUCE tensor shapes for 'allreduce\.torch\.pg\.p\d+\.\d+': \[36\] on rank \[0\]; "
                     r"\[5\] on rank \[1\]\. Every rank must submit the same collective with the same attributes under "
                     rf"one name\. Called at _ddp_scenario\.py:{DDP_STEP} in <module> \(DDP bucket 0\) on "
                     rf"rank \[0\]; _ddp_scenario\.py:{DDP_EXTRA} in <module> on rank \[1\]\.", done.output), done.output
    assert "last collectives" not in done.output  # the message names both calls: no records for it
    assert_no_strays(tmp_path, 2)


FSDP_PROGRAM = """
import sys, torch, torch.distributed as dist
import unison.torch
from torch.distributed.fsdp import fully_shard
torch.set_num_threads(1)
dist.init_process_group("unison")
width = 9 if dist.get_rank() == 1 else 8  # rank 1 builds its middle layer wider
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, width), torch.nn.Linear(width, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
model(torch.randn(4, 8)).sum().backward()
"""


def test_an_fsdp_mismatch_names_the_module_whose_all_gather_differs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    program = tmp_path / "fsdp_job.py"
    program.write_text(FSDP_PROGRAM)
    done = run_job(unisonrun("-np", "2", PYTHON, str(program)), deadline=120)
    assert done.returncode == 1, done.output
    forward = next(n for n, line in enumerate(FSDP_PROGRAM.splitlines(), 1) if "backward()" in line)
    assert re.search(r"Mismatched ALLGATHER tensor shapes for 'allgather\.torch\.pg\.\d+': .* on rank \[0\]; .* on "
                     rf"rank \[1\]\. .* Called at fsdp_job\.py:{forward} in <module> \(FSDP's all-gather of module '1'\) on "
                     r"ranks \[0, 1\]\.", done.output), done.output


def test_a_rank_that_raises_leaves_the_records_in_unisonrun_s_output_directory(tmp_path: Path) -> None:
    output = tmp_path / "out"
    done = run_job(unisonrun("-np", "2", "--output-filename", str(output), PYTHON, SCENARIO, str(tmp_path),
                             "raise", "1"), deadline=90)
    assert done.returncode == 1, done.output
    assert records_of(done.output, "unisonrun") == output
    shown = read_records(output)
    assert re.search(rf"^  rank 0: allreduce\.grad\.3 \[4\] float64, pending [\d.]+ s, at _scenario\.py:{STEP} ",
                     shown, re.M), shown
    assert re.search(r"^  rank 1: nothing$", shown, re.M), shown  # it raised before its step 3
    assert_no_strays(tmp_path, 2)


def test_under_plain_mpiexec_the_records_go_where_unison_flight_dir_says(tmp_path: Path) -> None:
    records = tmp_path / "records"
    done = run_job(launch("mpiexec", SCENARIO, str(tmp_path), "raise", "1"), env={"UNISON_FLIGHT_DIR": str(records)},
                   deadline=90)
    assert done.returncode != 0, done.output
    assert records_of(done.output, "mpiexec") == records
    assert sorted(path.name for path in records.glob("flight-*.json")) == ["flight-0.json", "flight-1.json"]
    assert_no_strays(tmp_path, 2)


def test_an_orderly_job_writes_no_records(tmp_path: Path) -> None:
    done = run_job(unisonrun("-np", "2", "--output-filename", str(tmp_path / "out"), PYTHON, "-c",
                             "import unison as hvd, numpy as np; hvd.init(); hvd.allreduce(np.ones(2)); hvd.shutdown()"))
    assert done.returncode == 0, done.output
    assert not list((tmp_path / "out").glob("flight-*.json")) and "last collectives" not in done.output
