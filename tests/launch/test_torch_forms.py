"""init_process_group("unison", ...) in every form gloo accepts: processes started by torch.multiprocessing.spawn
(tcp://, file://, env:// with and without RANK and WORLD_SIZE, an explicit store) and by hand (torch's env://
variables; hvd.init() alone or first). Each trains DDP to the parameters gloo gives; a desync is named on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import TRAIN, by_hand, clean_env, errors, free_port, outcome, run, same_as_gloo

pytest.importorskip("torch")
pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]


def _where(form: str, tmp_path: Path) -> str:
    if form == "spawn-file":
        return str(tmp_path / "rendezvous-file")
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("form", ["spawn-tcp", "spawn-file", "spawn-env", "spawn-envvars", "spawn-store"])
def test_mp_spawn_forms_train_as_on_gloo(tmp_path: Path, form: str, gloo_reference: list[dict[str, Any]]) -> None:
    port = str(free_port())
    env = clean_env(LAUNCH_TEST_WHERE=_where(form, tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    if form in ("spawn-tcp", "spawn-file", "spawn-store"):  # these need no MASTER_ADDR: it is not set
        env.pop("MASTER_ADDR")
        env.pop("MASTER_PORT")
    done = run([TRAIN, str(tmp_path), form, "unison"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    same_as_gloo(outcome(tmp_path), gloo_reference)


@pytest.mark.parametrize("form", ["hand", "hand-hvd"])
def test_processes_started_by_hand_train_as_on_gloo(tmp_path: Path, form: str,
                                                    gloo_reference: list[dict[str, Any]]) -> None:
    for done in by_hand(tmp_path, form, "unison"):
        assert done.returncode == 0, done.stderr[-3000:]
    same_as_gloo(outcome(tmp_path), gloo_reference)


def test_a_desync_under_mp_spawn_is_named_on_every_rank(tmp_path: Path) -> None:
    done = run([TRAIN, str(tmp_path), "spawn-tcp", "unison", "desync"],
               clean_env(LAUNCH_TEST_WHERE=f"127.0.0.1:{free_port()}"))
    assert done.returncode != 0
    for text in errors(tmp_path):
        assert "MismatchError: Mismatched ALLREDUCE tensor shapes" in text, (text, done.stderr[-3000:])


def test_a_desync_of_processes_started_by_hand_is_named_on_every_rank(tmp_path: Path) -> None:
    started = by_hand(tmp_path, "hand", "unison", "desync")
    assert all(done.returncode != 0 for done in started)
    for text in errors(tmp_path):
        assert "MismatchError: Mismatched ALLREDUCE tensor shapes" in text, (text, started[0].stderr[-2000:])
