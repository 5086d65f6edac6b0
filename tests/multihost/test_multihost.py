"""Jobs across emulated hosts: topology, collectives, hierarchical allreduce and the gRPC control plane."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from unison.testing.hosts import EmulatedHosts, cleanup, unavailable_reason

JOB = [sys.executable, str(Path(__file__).with_name("_job.py"))]
SECRET = "multihost-test-secret-" + "7" * 32
REASON = unavailable_reason()
needs_hosts = pytest.mark.skipif(bool(REASON), reason=f"{REASON}; these tests run jobs across emulated hosts")
pytestmark = pytest.mark.timeout(180)


def results(done: Any, size: int) -> list[dict[str, Any]]:
    """Each rank's RESULT object, by rank; fails with the job's output when one is missing."""
    found: dict[int, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    text = done.stdout
    start = text.find("RESULT ")
    while start >= 0:
        value, end = decoder.raw_decode(text, start + len("RESULT "))
        found[value["rank"]] = value
        start = text.find("RESULT ", end)
    assert done.returncode == 0 and sorted(found) == list(range(size)), (
        f"exit {done.returncode}, results from ranks {sorted(found)} of {size}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
    return [found[r] for r in range(size)]


def check_collectives(ranks: list[dict[str, Any]]) -> None:
    size = len(ranks)
    for r in ranks:
        assert r["big_checksum"] == r["big_expected"], r
        assert r["small"] == [[sum(q + i for q in range(size))] * 3 for i in range(4)]
        assert r["average"] == [(size - 1) / 2] * 2
        assert r["gathered"] == [q for q in range(size) for _ in range(q + 1)]
        assert r["broadcast"] == [float(size - 1 + i) for i in range(4)]
        assert r["hosts"] == [q["host"] for q in ranks]


@pytest.fixture(scope="module")
def two_by_two() -> Any:
    with EmulatedHosts(hosts=2, slots=2) as cluster:
        yield cluster


@needs_hosts
def test_topology_and_collectives_on_two_hosts_of_two_slots(two_by_two: EmulatedHosts) -> None:
    ranks = results(two_by_two.run(JOB, timeout=120), 4)
    expected = [("h0", 0, 0), ("h0", 1, 0), ("h1", 0, 1), ("h1", 1, 1)]
    assert [(r["host"], r["local_rank"], r["cross_rank"]) for r in ranks] == expected
    assert all(r["local_size"] == 2 and r["cross_size"] == 2 and r["homogeneous"] for r in ranks)
    check_collectives(ranks)
    assert all(r["hierarchical_calls"] == 0 for r in ranks)


@needs_hosts
def test_topology_of_a_heterogeneous_layout() -> None:
    with EmulatedHosts(hosts=2, slots=[2, 1]) as cluster:
        ranks = results(cluster.run(JOB, timeout=120), 3)
        hierarchical = results(cluster.run(JOB, env={"UNISON_HIERARCHICAL_ALLREDUCE": "1"}, timeout=120), 3)
    check_collectives(hierarchical)
    assert all(r["hierarchical_calls"] > 0 for r in hierarchical)
    layout = [(r["host"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in ranks]
    # cross_size counts the hosts that have a process of this local rank (Horovod's definition).
    assert layout == [("h0", 0, 2, 0, 2), ("h0", 1, 2, 0, 1), ("h1", 0, 1, 1, 2)]
    assert not any(r["homogeneous"] for r in ranks)
    check_collectives(ranks)


@needs_hosts
def test_hierarchical_allreduce_matches_flat_exactly(two_by_two: EmulatedHosts) -> None:
    env = {"UNISON_CHUNK_BYTES": "1048576"}
    flat = results(two_by_two.run(JOB, env=env, timeout=120), 4)
    hierarchical = results(two_by_two.run(JOB, env={**env, "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"},
                                          timeout=120), 4)
    check_collectives(hierarchical)
    assert all("hierarchical" in r["backend"] and r["hierarchical_calls"] >= 3 for r in hierarchical)
    keys = ("big_checksum", "big_head", "small", "average", "gathered", "broadcast")
    assert [{k: r[k] for k in keys} for r in flat] == [{k: r[k] for k in keys} for r in hierarchical]


@needs_hosts
def test_grpc_control_plane_across_hosts_admits_only_the_secret(two_by_two: EmulatedHosts) -> None:
    address = f"{two_by_two.addresses[0]}:29517"
    env = {"UNISON_CONTROLLER": "grpc", "UNISON_SERVICE_ADDR": address, "UNISON_SECRET": SECRET,
           "MULTIHOST_OUTSIDER": address}
    ranks = results(two_by_two.run(JOB, env=env, timeout=150), 4)
    check_collectives(ranks)
    assert all("GrpcBackend" in r["backend"] for r in ranks)
    # each host's lowest rank negotiates for its host: one stream per host
    assert [r["backend"].split("host_ranks=")[1].split("]")[0] + "]" for r in ranks] == ["[0, 1]"] * 2 + ["[2, 3]"] * 2
    outsider = ranks[-1]["outsider"]
    assert ranks[-1]["host"] == "h1"
    assert outsider["wrong"][0] == 1 and "UNAUTHENTICATED" in outsider["wrong"][1], outsider
    assert outsider["none"][0] == 2 and "UNISON_SECRET" in outsider["none"][1], outsider
    assert outsider["right"][0] == 0 and "job of 4 ranks" in outsider["right"][1], outsider


@needs_hosts
def test_grpc_across_hosts_without_an_address_is_refused(two_by_two: EmulatedHosts) -> None:
    done = two_by_two.run(JOB, env={"UNISON_CONTROLLER": "grpc"}, timeout=120)
    assert done.returncode != 0
    assert "set UNISON_SERVICE_ADDR=host:port" in done.stdout + done.stderr


@needs_hosts
def test_hosts_are_removed_after_the_context() -> None:
    with EmulatedHosts(hosts=2, slots=1, rate_mbit=100) as cluster:
        names = [*cluster.namespaces, cluster.switch]
        done = cluster.run(["tc", "qdisc", "show", "dev", "eth0"], np=0, host=1)
        assert "tbf" in done.stdout and "100Mbit" in done.stdout, done.stdout + done.stderr
    cleanup()
    listed = __import__("subprocess").run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    assert not any((Path("/etc/netns") / name).exists() for name in names)


def test_unavailable_reason_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert unavailable_reason() == "emulated hosts need root (ip netns add)"
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "tc" else "/usr/bin/" + tool)
    assert "iproute2" in unavailable_reason()
