"""unison.run takes horovod.run's arguments: those that apply are used, the others refused clearly."""

from __future__ import annotations

import pytest

from unison.elastic.membership import Host, Limits
from unison.errors import InvalidArgumentError, LaunchError
from unison.launcher import run
from unison.launcher.elastic.driver import ElasticOptions
from unison.launcher.function.options import DEFAULT_NUM_PROC, ELASTIC_ARGUMENTS, RunPlan, parse_hosts, plan

from . import _run_work

pytestmark = pytest.mark.timeout(120)


def test_num_proc_starts_that_many_processes() -> None:
    assert run(_run_work.rank_size_and_start_timeout, num_proc=2, start_timeout=30, timeout=90) == [
        (0, 2, "30.0"), (1, 2, "30.0")]


def test_horovod_style_call_with_hosts_and_harmless_arguments() -> None:
    # Positional as in horovod.run(fn, args, kwargs, num_proc); hosts on this machine only; the
    # arguments that concern other machines or Horovod's own launcher change nothing here.
    results = run(_run_work.rank_size_and_start_timeout, (), None, None, hosts="localhost:2", use_mpi=True,
                  use_gloo=False, ssh_port=22, ssh_identity_file="~/.ssh/id", disable_cache=True, verbose=2,
                  network_interface="lo", network_interfaces=["lo"], mpi_args="", timeout=90)
    assert [(rank, size) for rank, size, _ in results] == [(0, 2), (1, 2)]


def test_num_proc_default_and_its_alias() -> None:
    assert plan() == RunPlan(num_proc=DEFAULT_NUM_PROC, env={})
    assert plan(np=3).num_proc == 3 and plan(num_proc=3, np=3).num_proc == 3
    with pytest.raises(InvalidArgumentError, match=r"num_proc and its deprecated alias np disagree: "
                       r"num_proc=2, np=3. Pass num_proc only."):
        plan(num_proc=2, np=3)
    with pytest.raises(LaunchError, match=r"num_proc must be at least 1. Got num_proc=0."):
        plan(num_proc=0)
    with pytest.raises(InvalidArgumentError, match=r"num_proc is a number of processes \(an int\). Got num_proc='2'."):
        plan(num_proc="2")


def test_host_discovery_script_makes_the_job_elastic() -> None:
    decided = plan(num_proc=2, elastic={"host_discovery_script": "cat hosts", "max_np": 4, "slots": 2,
                                        "reset_limit": 3, "cooldown_range": (1, 5)}, elastic_timeout=30)
    assert decided.elastic == ElasticOptions("cat hosts", Limits(2, 4, 3, (1.0, 5.0)), 2, 30.0,
                                             timeout_source="elastic_timeout")
    assert decided.num_proc == 2
    assert plan(elastic={"host_discovery_script": "s", "min_num_proc": 1}).elastic == ElasticOptions(
        "s", Limits(1), None, 600.0, timeout_source="elastic_timeout")
    assert plan(elastic=dict.fromkeys(ELASTIC_ARGUMENTS)).elastic is None


@pytest.mark.parametrize("name", sorted(set(ELASTIC_ARGUMENTS) - {"host_discovery_script"}))
def test_elastic_arguments_need_a_discovery_script_or_hosts(name: str) -> None:
    value = (1, 2) if name == "cooldown_range" else 2
    with pytest.raises(InvalidArgumentError, match=rf"unison.run got {name}= but neither host_discovery_script= "
                       r"nor hosts=/hostfile=: an elastic job needs its hosts, from a program that prints"):
        plan(elastic={name: value})


def test_elastic_arguments_with_hosts_make_an_elastic_job_on_those_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    decided = plan(hosts="localhost:2,127.0.0.1:1", elastic={"min_num_proc": 2})
    assert decided.elastic == ElasticOptions("", Limits(2), fixed_hosts=(Host("localhost", 2), Host("127.0.0.1", 1)),
                                             timeout_source="elastic_timeout")
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "30")
    options = plan(hosts="localhost:1", elastic={"min_num_proc": 1}).elastic
    assert options is not None and (options.elastic_timeout, options.timeout_source) == (30.0, "HOROVOD_ELASTIC_TIMEOUT")
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "soon")
    with pytest.raises(InvalidArgumentError, match=r"HOROVOD_ELASTIC_TIMEOUT is how long an elastic job waits for its "
                       r"--min-np slots: a positive number of seconds. Got HOROVOD_ELASTIC_TIMEOUT='soon'."):
        plan(hosts="localhost:1", elastic={"min_num_proc": 1})
    with pytest.raises(InvalidArgumentError, match=r"unison.run starts processes on this machine only"):
        plan(hosts="far-away-1:2", elastic={"min_num_proc": 1})


def test_bad_elastic_arguments_say_what_to_do() -> None:
    script = {"host_discovery_script": "cat hosts"}
    with pytest.raises(InvalidArgumentError, match=r"An elastic unison.run needs min_num_proc= \(or num_proc="):
        plan(elastic=script)
    with pytest.raises(InvalidArgumentError, match=r"min_num_proc and its deprecated alias min_np disagree: "
                       r"min_num_proc=1, min_np=2. Pass min_num_proc only."):
        plan(elastic={**script, "min_num_proc": 1, "min_np": 2})
    with pytest.raises(InvalidArgumentError, match=r"max_num_proc must be at least min_num_proc. Got "
                       r"min_num_proc 3 max_num_proc 2."):
        plan(num_proc=3, elastic={**script, "max_np": 2})
    with pytest.raises(InvalidArgumentError, match=r"unison.run got host_discovery_script= with hosts=/hostfile=: "
                       r"an elastic job's hosts are the ones the discovery script prints"):
        plan(num_proc=1, hosts="localhost:2", elastic=script)
    with pytest.raises(InvalidArgumentError, match=r"cooldown_range is \(low, high\) in seconds. Got "
                       r"cooldown_range=5."):
        plan(num_proc=1, elastic={**script, "cooldown_range": 5})
    with pytest.raises(InvalidArgumentError, match=r"elastic_timeout is a positive number of seconds. Got "
                       r"elastic_timeout=0."):
        plan(num_proc=1, elastic=script, elastic_timeout=0)
    with pytest.raises(InvalidArgumentError, match=r"reset_limit is a number of resets \(an int\). Got "
                       r"reset_limit='2'."):
        plan(num_proc=1, elastic={**script, "reset_limit": "2"})


def test_elastic_argument_without_discovery_is_refused_by_run_before_anything_starts() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unison.run got max_num_proc=, min_num_proc= but neither "
                       r"host_discovery_script= nor hosts=/hostfile="):
        run(_run_work.rank_size_and_start_timeout, num_proc=2, min_num_proc=1, max_num_proc=4)


def test_gloo_is_refused_and_any_use_mpi_accepted() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unison.run got use_gloo=True, but unison has no Gloo "
                       r"backend: .* Leave use_gloo unset."):
        plan(use_gloo=True)
    for use_mpi in (True, False, None):  # False: Horovod's "no preference" (its examples pass it)
        assert plan(use_gloo=False, use_mpi=use_mpi).num_proc == DEFAULT_NUM_PROC


def test_use_mpi_false_as_horovods_examples_pass_it_runs_the_function() -> None:
    # Horovod's examples call horovod.run(..., use_gloo=comm == 'gloo', use_mpi=comm == 'mpi'):
    # without --communication both are False.
    assert run(_run_work.rank_size_and_start_timeout, num_proc=2, use_gloo=False, use_mpi=False,
               timeout=90) == [(0, 2, ""), (1, 2, "")]


def test_hosts_of_this_machine_give_the_slots(tmp_path) -> None:
    assert plan(hosts="localhost:2,127.0.0.1:1").num_proc == 3
    assert plan(hosts="localhost:4", num_proc=2).num_proc == 2
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine\nlocalhost slots=2\n\n127.0.0.1\n")
    assert plan(hostfile=str(hostfile)).num_proc == 3
    assert parse_hosts(["::1", "box:2"], "hosts") == [("::1", 1), ("box", 2)]


def test_bad_hosts_say_what_to_do(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"unison.run starts processes on this machine only, but "
                       r"hosts='localhost:1,far-away-1:2' names other machines: far-away-1. For a job across "
                       r"machines use `unisonrun -np N -H far-away-1:SLOTS python train.py`"):
        plan(hosts="localhost:1,far-away-1:2")
    with pytest.raises(InvalidArgumentError, match=r"num_proc=3 is more than the 2 slots that hosts/hostfile give"):
        plan(hosts="localhost:2", num_proc=3)
    with pytest.raises(InvalidArgumentError, match=r"Pass hosts= or hostfile=, not both"):
        plan(hosts="localhost:2", hostfile="hosts")
    with pytest.raises(InvalidArgumentError, match=r"hostfile='.*missing' could not be read"):
        plan(hostfile=str(tmp_path / "missing"))
    with pytest.raises(InvalidArgumentError, match=r"hosts='localhost:0': each host is NAME, NAME:SLOTS or "
                       r"\(in a hostfile\) NAME slots=SLOTS, with SLOTS >= 1. Got 'localhost:0'."):
        plan(hosts="localhost:0")


def test_start_timeout_and_output_filename_and_executable(tmp_path) -> None:
    decided = plan(start_timeout=45, output_filename=str(tmp_path), executable="/usr/bin/python3")
    assert decided == RunPlan(num_proc=DEFAULT_NUM_PROC, env={"UNISON_START_TIMEOUT_SECONDS": "45.0"},
                              output_dir=str(tmp_path), executable="/usr/bin/python3")
    for bad in (0, -1.0, float("nan"), "30", True):
        with pytest.raises(InvalidArgumentError, match=r"start_timeout is a positive number of seconds. "
                           rf"Got start_timeout={bad!r}."):
            plan(start_timeout=bad)
