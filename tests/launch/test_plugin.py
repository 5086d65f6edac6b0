"""torch's plug-in hook (`unison_torch_backend`, entry point group ``torch.backends``): a script that
calls ``init_process_group("unison")`` without ``import unison.torch`` runs under mpiexec (no MASTER_ADDR,
where torch alone stops with "environment variable RANK expected") and under torchrun. The hook is
called here as torch calls an installed entry point at ``import torch``."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, clean_env

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(200)

SCRIPT = """
import sys, torch
import unison_torch_backend
if "hook" in sys.argv:
    unison_torch_backend.register()  # what torch does with an installed entry point
import torch.distributed as dist
print("unison imported before init:", "unison" in sys.modules, flush=True)
dist.init_process_group("unison")
total = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} {total.tolist()} {dist.get_backend()}", flush=True)
dist.destroy_process_group()
"""


def _mpiexec() -> str:
    from unison.testing.run import find_mpiexec

    found = find_mpiexec()
    if found is None:
        pytest.skip("no mpiexec")
    return found


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_init_process_group_without_importing_unison_torch(tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    head = ([_mpiexec(), "-n", "2", sys.executable] if launcher == "mpiexec" else
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])
    done = subprocess.run([*head, str(script), "hook"], capture_output=True, text=True, timeout=150, cwd=ROOT,
                          env=clean_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("unison imported before init: False") == 2, done.stdout
    assert "rank 0 of 2 [3.0, 3.0] unison" in done.stdout and "rank 1 of 2 [3.0, 3.0] unison" in done.stdout


def test_without_the_hook_torch_stops_where_the_hook_helps(tmp_path: Path) -> None:
    """The case the hook is for: under mpiexec without MASTER_ADDR torch alone asks for RANK."""
    if any(entry.name == "unison" for entry in importlib.metadata.entry_points(group="torch.backends")):
        pytest.skip("the entry point is installed: import torch calls the hook")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([_mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=150, cwd=ROOT, env=clean_env())
    assert done.returncode != 0
    assert "environment variable RANK expected" in done.stderr


def test_an_installed_entry_point_names_the_backend_at_import_torch() -> None:
    if not any(entry.name == "unison" for entry in importlib.metadata.entry_points(group="torch.backends")):
        pytest.skip("the torch.backends entry point is not installed (pyproject.toml's entry-points)")
    done = subprocess.run([sys.executable, "-c", "import sys, torch, torch.distributed as dist; "
                           "print(hasattr(dist.Backend, 'UNISON'), 'unison' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, env=clean_env())
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]
