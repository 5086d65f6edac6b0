"""unison.ray's pure decisions, without Ray: where each worker ranks, what it starts with, what the
placement asks for, how failures read, which hosts discovery finds, and the executor's argument checks."""

from __future__ import annotations

import pytest

from unison.errors import InvalidArgumentError, NotInitializedError
from unison.ray import MiniSettings, RayExecutor
from unison.ray._calls import stopped_reason
from unison.ray._discovery import slots_of
from unison.ray._elastic import in_ray_words, start_outcomes
from unison.ray._layout import place, rank_variables
from unison.ray._outcomes import failed_ranks, failure_message
from unison.ray._placement import Request, room_in, timeout_message, visible_devices
from unison.ray._static import common_variables
from unison.ray._worker import Outcome


def test_twelve_ranks_on_three_hosts_registered_round_robin() -> None:
    """Horovod's coordinator registration case: each host's workers on consecutive ranks."""
    places = place(["a", "b", "c"] * 4)
    assert sorted(p.rank for p in places) == list(range(12))
    assert all(p.cross_size == 3 and p.local_size == 4 for p in places)
    assert {p.cross_rank for p in places} == {0, 1, 2} and {p.local_rank for p in places} == {0, 1, 2, 3}
    assert [p.rank for p in places if p.node == "a"] == [0, 1, 2, 3]  # rank 0 is the first worker made
    assert [p.node_rank for p in places[:3]] == [0, 1, 2]


@pytest.mark.parametrize("hosts", [["host1"] * 5 + ["host2"] * 4 + ["host3"] * 3])
def test_cross_ranks_count_the_hosts_with_each_local_rank(hosts: list[str]) -> None:
    """Horovod's cross-rank case: 5, 4 and 3 workers on three hosts."""
    places = place(hosts)
    one = [p for p in places if p.cross_size == 1]
    two = [p for p in places if p.cross_size == 2]
    assert [(p.local_rank, p.cross_rank) for p in one] == [(4, 0)]
    assert sorted(p.cross_rank for p in two) == [0, 1] and {p.local_rank for p in two} == {3}
    assert len([p for p in places if p.cross_size == 3]) == 9
    assert [p.rank for p in places] == list(range(12))  # made host by host: the order stays


def test_the_variables_a_worker_starts_with() -> None:
    where = place(["n1", "n2", "n1"])[2]
    env = rank_variables(where, "10.0.0.5", 29500, "n1", {"MASTER_PORT": "1", "EXTRA": "x"})
    assert {name: env[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                         "MASTER_ADDR")} == {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1",
                                                             "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                                                             "MASTER_ADDR": "10.0.0.5"}
    assert env["MASTER_PORT"] == "1" and env["EXTRA"] == "x"  # the caller's variables win
    assert (env["HOROVOD_HOSTNAME"], env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("n1", "0", "1")


def test_common_variables_carry_the_start_timeout_and_the_interfaces() -> None:
    assert common_variables(MiniSettings(timeout_s=45)) == {"UNISON_START_TIMEOUT_SECONDS": "45"}
    assert common_variables(MiniSettings(timeout_s=1.5, nics={"ib0"}))["GLOO_SOCKET_IFNAME"] == "ib0"


def test_what_the_placement_group_asks_for() -> None:
    assert Request(3, 2, 0).bundles() == [{"CPU": 2}] * 3 and Request(3, 2, 0).strategy == "PACK"
    spread = Request(4, 1, 1, num_hosts=2)
    assert spread.bundles() == [{"CPU": 2, "GPU": 2}] * 2 and spread.strategy == "STRICT_SPREAD"


def test_the_timeout_message_says_what_was_asked_and_what_is_free() -> None:
    text = timeout_message(Request(2, 1, 0, num_hosts=2), 5, {"CPU": 4.0})
    assert text.startswith("Placement group creation timed out after 5 s: 2 workers need CPU 2 (on distinct "
                           "nodes, bundles [{'CPU': 1}] * 2, STRICT_SPREAD), but the cluster has CPU 4 available")
    assert "raise placement_group_timeout_s" in text


def test_the_room_a_group_has_counts_whole_workers_per_bundle() -> None:
    assert room_in([{"CPU": 1.0}] * 2, {"CPU": 1}) == 2
    assert room_in([{"CPU": 2.5, "GPU": 1.0}, {"CPU": 1.0}], {"CPU": 1}) == 3
    assert room_in([{"CPU": 4.0, "GPU": 1.0}], {"CPU": 1, "GPU": 1}) == 1
    assert room_in([{"CPU": 4.0}], {"CPU": 1, "GPU": 0.5}) == 0
    assert room_in([{"CPU": 0.9}], {"CPU": 0.3}) == 3
    assert room_in([{"CPU": 1.0}] * 3, {}) == 3


def test_a_worker_that_did_not_start_blames_its_host_unless_another_host_has_no_node() -> None:
    names, hosts = ["rank 0 (a)", "rank 1 (b)", "rank 2 (ghost)"], ["a", "b", "ghost"]
    beside = start_outcomes([True, False, False], names, hosts, {"ghost"}, 8, 1)
    assert [(o.status, o.cause) for o in beside] == [("ok", False), ("failed", False), ("failed", True)]
    assert beside[1].reason == "rank 1 (b): its worker had not started within 8 s, when the epoch ended for want " \
                               "of a Ray node for ghost"
    assert beside[2].reason == "rank 2 (ghost): no Ray node stood for that host within 8 s " \
                               "(placement_group_timeout_s): no alive node has the resource node:ghost"
    alone = start_outcomes([True, False], names[:2], hosts[:2], set(), 8, 2)
    assert [(o.status, o.cause) for o in alone] == [("ok", False), ("failed", True)]
    assert alone[1].reason.endswith("Ray has no free room on that host (a node with the resource node:b and 2 CPUs free)")


def test_workers_of_a_node_see_every_gpu_of_the_node() -> None:
    assert visible_devices(["a", "b", "a", "a"], [[2], [0], [0], [1]]) == ["0,1,2", "0", "0,1,2", "0,1,2"]


def test_failures_read_causes_first() -> None:
    outcomes = [Outcome("failed", reason="rank 0 (h, pid 1) failed: AbortedError: rank 2 ..."),
                Outcome("ok", 1),
                Outcome("failed", reason="rank 2 (h, pid 3) failed: ValueError: bad at t.py:9 in f", cause=True),
                Outcome("failed", reason="rank 3 (h): its worker process ended (RayActorError: died)", cause=True)]
    assert failed_ranks(outcomes) == [2, 3, 0]
    assert failure_message("RayExecutor.run", outcomes, "after").splitlines() == [
        "RayExecutor.run failed on 3 of 4 ranks:",
        "  rank 2 (h, pid 3) failed: ValueError: bad at t.py:9 in f",
        "  rank 3 (h): its worker process ended (RayActorError: died)",
        "  rank 0 (h, pid 1) failed: AbortedError: rank 2 ...",
        "after"]


def test_a_rank_stopped_after_another_failed_is_named_once() -> None:
    """The worker's name already says "rank R (host)"; the reason must not wrap it in a second "rank R (...)"."""
    assert stopped_reason("rank 0 (vm)", 10.0, "rank 1") == \
        "rank 0 (vm) was stopped: still running 10 s after rank 1 failed"
    assert stopped_reason("rank 3 (host-2)", 2.5, "rank 0") == \
        "rank 3 (host-2) was stopped: still running 2.5 s after rank 0 failed"


def _node(address: str, alive: bool = True, **resources: float) -> dict[str, object]:
    return {"NodeManagerAddress": address, "alive": alive, "Resources": resources}


def test_discovery_counts_each_alive_nodes_slots() -> None:
    """Horovod's multi-node discovery cases, on node lists written by hand."""
    nodes = [_node(f"host-{i}", CPU=8, GPU=2) for i in (1, 2, 3)] + [_node("gone", alive=False, CPU=8)]
    assert slots_of(nodes, use_gpu=True) == {"host-1": 2, "host-2": 2, "host-3": 2}
    assert slots_of(nodes, use_gpu=True, gpus_per_worker=2) == {"host-1": 1, "host-2": 1, "host-3": 1}
    assert slots_of(nodes, cpus_per_worker=3) == {"host-1": 2, "host-2": 2, "host-3": 2}
    cpus_only = [_node(f"host-{i}", CPU=8) for i in (1, 2, 3)]
    assert sum(slots_of(cpus_only, use_gpu=True).values()) == 0  # GPUs asked for, none there


class _StartedAdapter:
    """Stands for a started adapter: what `RayExecutor.shutdown` calls on it."""

    def shutdown(self) -> None:
        pass


def test_calls_after_shutdown_say_the_executor_was_shut_down() -> None:
    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.adapter = _StartedAdapter()  # as start() leaves it, without starting Ray
    executor.shutdown()
    assert executor.adapter is None
    for call in (lambda: executor.run(lambda: None), lambda: executor.execute(lambda worker: None)):
        with pytest.raises(NotInitializedError, match=r"^RayExecutor\.(run|execute)\(\) was called after shutdown\(\), "
                           r"which ended the workers\. Call start\(\) to start them again\.$"):
            call()
    executor.shutdown()  # again: nothing to do, and still shut down
    with pytest.raises(NotInitializedError, match=r"RayExecutor.run\(\) was called after shutdown\(\)"):
        executor.run(lambda: None)


def test_membership_messages_speak_of_the_executors_arguments() -> None:
    assert in_ray_words("the job needs reset 3, but --reset-limit is 2; stopping. Raise --reset-limit to allow") \
        == "the job needs reset 3, but reset_limit is 2; stopping. Raise reset_limit to allow"
    assert in_ray_words("pass --blacklist-cooldown-range A B so that") == "pass cooldown_range=(A, B) so that"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"min_workers": 1, "num_workers": 1}, r"Both `min_workers` and `num_workers` provided\."),
    ({"max_workers": 4}, r"`max_workers` provided without any positive `min_workers`"),
    ({"min_workers": 3, "max_workers": 2}, r"needs 1 <= min_workers <= max_workers\. Got min_workers=3"),
    ({}, r"needs num_workers=N, num_hosts=H with num_workers_per_host=K, or \(elastic\) min_workers=M"),
    ({"num_workers": 2, "num_hosts": 1}, r"Give num_workers, or num_hosts with num_workers_per_host, not both"),
    ({"num_workers": 0}, r"must be at least 1\. Got num_workers=0"),
    ({"num_workers": 2, "gpus_per_worker": 1}, r"gpus_per_worker is set, but use_gpu is False"),
    ({"num_workers": 2, "cpus_per_worker": 0}, r"cpus_per_worker must be positive"),
])
def test_arguments_that_cannot_make_a_job_are_refused(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        RayExecutor(RayExecutor.create_settings(), **kwargs)


def test_settings_are_checked_and_calls_need_start() -> None:
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=5, nics={"eth0"})
    assert (settings.timeout_s, settings.placement_group_timeout_s, settings.nics) == (30, 5, {"eth0"})
    with pytest.raises(InvalidArgumentError, match=r"placement_group_timeout_s must be a positive number of "
                       r"seconds\. Got placement_group_timeout_s=-1\."):
        RayExecutor.create_settings(placement_group_timeout_s=-1)
    executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=None)  # type: ignore[arg-type]
    assert settings.elastic is False and executor.params["num_workers_per_host"] == 1
    with pytest.raises(NotInitializedError, match=r"RayExecutor.execute\(\) was called before start\(\)"):
        executor.execute(lambda worker: None)
    executor.shutdown()  # nothing started: nothing to do
    with pytest.raises(NotInitializedError, match=r"RayExecutor.run\(\) was called before start\(\)"):
        executor.run(lambda: None)
    RayExecutor(settings, min_workers=1)
    assert settings.elastic is True
