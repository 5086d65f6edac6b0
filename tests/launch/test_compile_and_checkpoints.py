"""torch.compile of a DDP model, FSDP2's full state dicts (model and optimizer, cpu_offload), DTensor's
full_tensor() and torch.distributed.checkpoint's save and load on the unison backend: the same results as
on gloo, at 2 ranks (real processes, started by torch.multiprocessing.spawn)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import HERE, clean_env, free_port, run

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(300)]

PROGRAM = str(HERE / "_checkpoint.py")


def _results(out: Path, backend: str, check: str) -> list[dict[str, Any]]:
    out.mkdir()
    done = run([PROGRAM, str(out), backend, check], clean_env(LAUNCH_TEST_WHERE=f"127.0.0.1:{free_port()}"))
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"result-{rank}").read_text()) for rank in range(2)]


def test_torch_compile_of_ddp_trains_as_on_gloo(tmp_path: Path) -> None:
    unison = _results(tmp_path / "unison", "unison", "compile")
    gloo = _results(tmp_path / "gloo", "gloo", "compile")
    assert unison[0]["params"] == unison[1]["params"] == gloo[0]["params"]


def test_fsdp2_full_state_dicts_full_tensor_and_checkpoints_as_on_gloo(tmp_path: Path) -> None:
    unison = _results(tmp_path / "unison", "unison", "fsdp")
    gloo = _results(tmp_path / "gloo", "gloo", "fsdp")
    assert unison == gloo
    assert unison[0]["model"] and unison[0]["optim"]  # rank 0 holds the full dicts (cpu_offload: rank 0 alone)
    assert unison[0]["full"] == unison[1]["full"]
    assert unison[0]["roundtrip"] and unison[1]["roundtrip"]
