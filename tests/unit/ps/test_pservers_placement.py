"""Where `unisonrun --pservers` puts the servers: the hosts of -H or a hostfile, dealt round robin."""

from __future__ import annotations

import pytest

from unison.errors import LaunchError
from unison.launcher.pservers.decisions import Placement, hosts_of, place_servers, spans_hosts


def test_hosts_come_from_the_option_or_the_hostfile_once_each_in_order() -> None:
    assert hosts_of("") == []
    assert hosts_of("b:2,a:1,b:1") == ["b", "a"]
    assert hosts_of("", "# nodes\nnode1 slots=4\n\nnode2:2  # two\nnode1\n") == ["node1", "node2"]


def test_servers_are_dealt_round_robin_and_this_host_is_local() -> None:
    placed = place_servers(5, ["h0", "h1"], "h0")
    assert [(p.index, p.host, p.local) for p in placed] == [
        (0, "h0", True), (1, "h1", False), (2, "h0", True), (3, "h1", False), (4, "h0", True)]
    assert [p.local for p in place_servers(2, ["localhost", "node7"], "node7.cluster.example")] == [True, True]


def test_without_hosts_every_server_is_here_on_loopback() -> None:
    placed = place_servers(2, [], "h0")
    assert placed == [Placement(0, "127.0.0.1", True), Placement(1, "127.0.0.1", True)]
    assert not spans_hosts(placed, [], "h0")


def test_servers_listen_on_every_interface_when_trainers_may_run_elsewhere() -> None:
    assert spans_hosts(place_servers(1, ["h0", "h1"], "h0"), ["h0", "h1"], "h0")  # the server is here, a trainer is not
    assert not spans_hosts(place_servers(2, ["h0"], "h0"), ["h0"], "h0")


def test_at_least_one_server() -> None:
    with pytest.raises(LaunchError, match=r"--pservers must be at least 1. Got --pservers 0."):
        place_servers(0, ["h0"], "h0")


def test_what_the_launcher_does_when_a_server_ends() -> None:
    from unison.launcher.pservers.decisions import RESTARTS, server_exit
    from unison.launcher.supervision.blame import how_ended

    assert [server_exit(code, restarts=0, checkpoint_dir="/ck") for code in (0, 3)] == ["ended", "ended"]
    assert [server_exit(code, restarts=0, checkpoint_dir="/ck") for code in (-9, 1, 137)] == ["restart"] * 3
    assert server_exit(-9, restarts=0, checkpoint_dir="") == "lost"
    assert server_exit(-9, restarts=RESTARTS - 1, checkpoint_dir="/ck") == "restart"
    assert server_exit(-9, restarts=RESTARTS, checkpoint_dir="/ck") == "lost"
    assert (how_ended(-9), how_ended(2)) == ("killed by signal 9 (SIGKILL)", "exited with status 2")


def test_a_trainer_is_named_by_its_role_and_every_failure_when_they_are_independent() -> None:
    from unison.launcher.supervision.blame import Markers, blame

    seen = Markers(ended={0: (10, 3), 1: (11, -9), 2: (12, 0)},
                   written_ns={("ended", 1): 1, ("ended", 0): 2, ("ended", 2): 3})
    role = "parameter-server trainer"
    assert blame(seen, [], {}, "h", role=role, independent=True) == {
        1: "parameter-server trainer 1 (h, pid 11) killed by signal 9 (SIGKILL).",
        0: "parameter-server trainer 0 (h, pid 10) exited with status 3."}
    assert blame(seen, [], {}, "h") == {1: "rank 1 (h, pid 11) killed by signal 9 (SIGKILL) before unison.init()."}
