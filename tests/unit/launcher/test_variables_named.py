"""Every variable unisonrun, its elastic driver and unison.run set for the ranks is named to mpiexec.

Open MPI passes to the ranks on other hosts only the variables that ``-x NAME`` names (and MPICH only
those ``-genvlist`` lists, once a user narrowed it): a variable set but not named reaches the ranks
on the launcher's host and not the others. Each launch here runs against an Open MPI mpiexec with
`supervise` replaced, and compares what it set in the ranks' environment with what it named.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import unison
from unison.elastic.membership import Epoch, Host
from unison.launcher import cli
from unison.launcher.elastic import driver
from unison.launcher.function import run as function_run
from unison.launcher.mpi.mpiexec import MpiExec
from unison.launcher.supervision.supervise import JobOutcome

OPEN_MPI = MpiExec("mpirun", "openmpi", "4.1.5")


class _Launched(Exception):
    """Stops unison.run once its command was captured (it would read the ranks' results next)."""


def _capture(into: dict[str, Any], outcome: JobOutcome | None = None) -> Any:
    def supervise(cmd: list[str], directory: object, env: dict[str, str], **kwargs: object) -> JobOutcome:
        into["cmd"], into["env"] = list(cmd), dict(env)
        if outcome is None:
            raise _Launched()
        return outcome
    return supervise


def _set_but_not_named(seen: dict[str, Any]) -> set[str]:
    """What the launch set for its ranks, or that is an exported unison setting, and did not name."""
    cmd, env = seen["cmd"], seen["env"]
    named = [cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag == "-x"]
    assert len(named) == len(set(named)), named  # each once
    set_for_ranks = {name for name, value in env.items() if os.environ.get(name) != value}
    assert set_for_ranks, "the launch set nothing for its ranks"
    assert env.get("UNISON_CONTROLLER") == "mpi"  # exported by each test, unchanged by the launch
    return (set_for_ranks | {"UNISON_CONTROLLER"}) - set(named)


@pytest.fixture(autouse=True)
def exported_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting the user exported rather than passed with -x: ranks on other hosts need it too."""
    monkeypatch.setenv("UNISON_CONTROLLER", "mpi")


def test_unisonrun_names_its_settings_and_its_own_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "find_mpiexec", lambda explicit="", check=True: OPEN_MPI)
    monkeypatch.setattr(cli, "supervise", _capture(seen, JobOutcome(returncode=0, failures={})))
    program = tmp_path / "train.py"
    program.write_text("")
    status = cli.launch(2, [sys.executable, str(program)], env_pairs=[("UNISON_FUSION_THRESHOLD", "1024")],
                        extra_env={"UNISON_CYCLE_TIME": "1"}, keep_going=True)
    assert status == 0
    assert _set_but_not_named(seen) == set()


def test_each_elastic_epoch_names_what_it_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(driver, "supervise", _capture(seen, JobOutcome(returncode=0, failures={})))
    env = {**os.environ, "UNISON_ELASTIC_STORE": str(tmp_path), "UNISON_ELASTIC_DRIVER": "key@127.0.0.1:1",
           "UNISON_FUSION_THRESHOLD": "1024"}
    driver._run_epoch(OPEN_MPI, Epoch(3, (Host("localhost", 2),)), [sys.executable, "-c", "pass"], env,
                      mpi_args="", launcher_exec="", iface="", env_names=["UNISON_FUSION_THRESHOLD"], timeout=None)
    assert seen["env"]["UNISON_ELASTIC_EPOCH"] == "3"
    assert _set_but_not_named(seen) == set()


def test_unison_run_names_its_settings_and_its_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(function_run, "find_mpiexec", lambda explicit="", check=True: OPEN_MPI)
    monkeypatch.setattr(function_run, "supervise", _capture(seen))
    with pytest.raises(_Launched):
        unison.run(os.getpid, np=2, env={"UNISON_CYCLE_TIME": "1"})
    assert _set_but_not_named(seen) == set()


def test_names_no_shell_could_export_are_left_off_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # bash exports a function as BASH_FUNC_f%%; a comma would split Hydra's -genvlist in two
    seen: dict[str, Any] = {}
    monkeypatch.setattr(function_run, "find_mpiexec", lambda explicit="", check=True: OPEN_MPI)
    monkeypatch.setattr(function_run, "supervise", _capture(seen))
    with pytest.raises(_Launched):
        unison.run(os.getpid, np=2, env={"BASH_FUNC_f%%": "() {  :\n}", "A,B": "1", "MY_SETTING": "2"})
    assert seen["env"]["BASH_FUNC_f%%"] == "() {  :\n}" and seen["env"]["A,B"] == "1"  # still the ranks' own
    assert _set_but_not_named(seen) == {"BASH_FUNC_f%%", "A,B"}


def test_a_name_mpiexec_cannot_pass_is_refused_with_the_rule() -> None:
    with pytest.raises(unison.errors.LaunchError, match=r"-x A,B=1: 'A,B' is not a variable name mpiexec can pass"):
        cli.env_pairs(["A,B=1"], {})
