"""An elastic unison.ray.RayExecutor on Ray's local cluster: Horovod's discovery cases (test_ray_elastic_v2.py)
and elastic runs whose hosts are fake, Ray custom resources ``node:host-N`` on this one machine."""

from __future__ import annotations

import glob
import itertools
import os
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from ray import cloudpickle  # noqa: E402

from unison.errors import LaunchError, UnisonNotImplementedError  # noqa: E402
from unison.ray import RayExecutor  # noqa: E402
from unison.ray._discovery import RayHostDiscovery  # noqa: E402

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """4 CPUs, 4 GPUs of Ray's bookkeeping only, and six fake hosts: a worker asks for a sliver of
    ``node:host-N`` to run "on" host N."""
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, logging_level="warning",
             resources={f"node:host-{i}": 1 for i in range(1, 7)})
    try:
        yield
    finally:
        ray.shutdown()


class Stages:
    """A discovery whose answer moves to the next stage when told (`advance`), or after `polls` polls."""

    def __init__(self, *stages: dict[str, int], polls: int | None = None) -> None:
        self.stages = list(stages)
        self.stage = 0
        self.polls = polls
        self.calls = 0
        self.lock = threading.Lock()

    def advance(self, to: int) -> None:
        with self.lock:
            self.stage = max(self.stage, min(to, len(self.stages) - 1))

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        with self.lock:
            self.calls += 1
            if self.polls is not None and self.calls % self.polls == 0:
                self.stage = min(self.stage + 1, len(self.stages) - 1)
            return dict(self.stages[self.stage])


class Journal:
    """A callback keeping what the ranks logged; `when(condition, action)` acts on the first entry that fits."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.rules: list[tuple[Any, Any]] = []

    def when(self, condition: Any, action: Any) -> None:
        self.rules.append((condition, action))

    def __call__(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        for condition, action in self.rules:
            if condition(entry):
                action()

    def of(self, key: str) -> list[dict[str, Any]]:
        return [entry for entry in self.entries if key in entry]


def executor(discovery: Stages, placement_group_timeout_s: float = 30, **kwargs: Any) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=placement_group_timeout_s)
    settings.discovery = discovery
    settings.discovery_interval_s = 0.1
    return RayExecutor(settings, override_discovery=False, cpus_per_worker=1, **kwargs)


def training(iterations: int, fail_on: str = "") -> tuple[str, int, int, list[float]]:
    """Horovod's elastic test function: a TorchState, a commit per iteration, logs at start, per
    iteration and at the end; this rank's host, the size, the last iteration and the parameters.
    `fail_on`: the host on which rank's first launch raises at iteration 4."""
    import time

    import torch

    import unison.torch as hvd
    from unison.ray import ray_logger

    hvd.init()
    host = os.environ["HOROVOD_HOSTNAME"]
    torch.manual_seed(hvd.rank())  # different on every rank: the state must come from the commits
    model = torch.nn.Linear(2, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    ray_logger.log({"started": os.getpid(), "host": host, "size": hvd.size()}, chief_only=False)

    @hvd.elastic.run
    def train(state: Any) -> int:
        for state.epoch in range(state.epoch, iterations):  # noqa: B020  (Horovod's idiom: the epoch is state)
            ray_logger.log({"epoch": state.epoch, "size": hvd.size()})
            if host == fail_on and os.environ["UNISON_ELASTIC_EPOCH"] == "0" and state.epoch == 4:
                raise RuntimeError(f"{host} lost its disk")
            optimizer.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            time.sleep(0.05)
            state.commit()  # where a change of hosts stops the ranks
        ray_logger.log({"finished": os.getpid()}, chief_only=False)
        return int(state.epoch)

    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    last = train(state)
    return host, hvd.size(), last, torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def test_ray_discovery_counts_this_nodes_cpu_and_gpu_slots(cluster: None) -> None:
    """Horovod's CPU and GPU discovery cases, on the running cluster (4 CPUs, 4 GPUs)."""
    here = ray.util.get_node_ip_address()
    assert RayHostDiscovery(cpus_per_worker=1).find_available_hosts_and_slots() == {here: 4}
    assert RayHostDiscovery(cpus_per_worker=2).find_available_hosts_and_slots() == {here: 2}
    assert RayHostDiscovery(use_gpu=True, cpus_per_worker=1).find_available_hosts_and_slots() == {here: 4}
    assert RayHostDiscovery(use_gpu=True, gpus_per_worker=2).find_available_hosts_and_slots() == {here: 2}


def test_max_workers_caps_the_job_when_hosts_are_added(cluster: None) -> None:
    discovery = Stages({"host-1": 2}, {"host-1": 2, "host-4": 1, "host-5": 1})
    job = executor(discovery, min_workers=1, max_workers=2)
    job.start()
    journal = Journal()
    journal.when(lambda entry: entry.get("epoch") == 2, lambda: discovery.advance(1))
    try:
        results = job.run(training, args=[12], callbacks=[journal])
        with pytest.raises(UnisonNotImplementedError, match=r"cannot return object refs"):
            job.run_remote(training)
        with pytest.raises(UnisonNotImplementedError, match=r"Call execute\(\) instead"):
            job.execute_single(lambda worker: None)
    finally:
        job.shutdown()
    assert [(host, size, last) for host, size, last, _ in results] == [("host-1", 2, 11)] * 2
    assert len(journal.of("started")) == 2 and len(journal.of("finished")) == 2  # never relaunched
    assert results[0][3] == results[1][3]


def test_the_job_starts_once_min_workers_slots_are_there(cluster: None) -> None:
    discovery = Stages({"host-1": 1}, {"host-1": 1, "host-4": 1, "host-5": 1},
                       {"host-1": 1, "host-4": 1, "host-5": 1, "host-6": 1}, polls=5)
    job = executor(discovery, min_workers=4, max_workers=4)
    job.start()  # waits for the third stage
    journal = Journal()
    try:
        results = job.run(training, args=[5], callbacks=[journal])
    finally:
        job.shutdown()
    assert sorted(host for host, _, _, _ in results) == ["host-1", "host-4", "host-5", "host-6"]
    assert {size for _, size, _, _ in results} == {4}
    assert len(journal.of("started")) == 4 and len(journal.of("finished")) == 4


def nth_at_size(n: int, size: int) -> Any:
    """A journal condition: the `n`-th iteration rank 0 logs while the job has `size` ranks."""
    seen = [0]

    def condition(entry: dict[str, Any]) -> bool:
        if "epoch" in entry and entry["size"] == size:
            seen[0] += 1
        return seen[0] == n and entry.get("size") == size

    return condition


def test_hosts_added_then_removed_relaunch_from_the_last_commit(cluster: None) -> None:
    discovery = Stages({"host-1": 2}, {"host-1": 2, "host-2": 1}, {"host-2": 1})
    job = executor(discovery, min_workers=1)
    job.start()
    journal = Journal()
    journal.when(nth_at_size(3, 2), lambda: discovery.advance(1))
    journal.when(nth_at_size(3, 3), lambda: discovery.advance(2))
    try:
        results = job.run(training, args=[20], callbacks=[journal])
    finally:
        job.shutdown()
    assert [(host, size, last) for host, size, last, _ in results] == [("host-2", 1, 19)]
    assert [entry["size"] for entry in journal.of("started")] == [2, 2, 3, 3, 3, 1]
    launches = [[entry["epoch"] for entry in group]
                for _, group in itertools.groupby(journal.of("epoch"), key=lambda entry: entry["size"])]
    assert len(launches) == 3 and launches[0][0] == 0 and launches[-1][-1] == 19
    for before, after in zip(launches, launches[1:]):
        assert after[0] == before[-1]  # went on from the commit at which the ranks stopped


def stores() -> set[str]:
    return set(glob.glob(f"/dev/shm/unison-ray-elastic-{os.getuid()}-*"))


def test_a_failing_host_is_blacklisted_and_the_job_goes_on(cluster: None) -> None:
    discovery = Stages({"host-1": 2, "host-2": 1})
    job = executor(discovery, min_workers=1)
    job.start()
    journal = Journal()
    before = stores()
    during: set[str] = set()
    journal.when(lambda entry: entry.get("epoch") == 6, lambda: during.update(stores()))
    try:
        results = job.run(training, args=[10], kwargs={"fail_on": "host-2"}, callbacks=[journal])
        assert len(during - before) == 1 and stores() == before  # the run's commits, gone with it
    finally:
        job.shutdown()
    assert [(host, size, last) for host, size, last, _ in results] == [("host-1", 2, 9)] * 2
    assert results[0][3] == results[1][3]  # the same parameters on both ranks
    relaunched = [entry["epoch"] for entry in journal.of("epoch") if entry["size"] == 2]
    assert relaunched[0] == 3  # from the last commit (iteration 3's), not from the start


def test_a_host_ray_cannot_place_on_is_blacklisted(cluster: None, caplog: pytest.LogCaptureFixture) -> None:
    """Discovery names a host no Ray node stands for (no resource node:ghost): its worker never starts."""
    # ghost is blamed once the timeout has passed; host-1's worker, if it was slower than that, is not
    job = executor(Stages({"host-1": 1, "ghost": 1}), min_workers=1, placement_group_timeout_s=10)
    job.start()
    try:
        with caplog.at_level("WARNING", logger="unison.ray"):
            results = job.run(training, args=[3])
    finally:
        job.shutdown()
    assert [(host, size, last) for host, size, last, _ in results] == [("host-1", 1, 2)]
    assert "rank 1 (ghost): no Ray node stood for that host within 10 s (placement_group_timeout_s): no alive node " \
           "has the resource node:ghost" in caplog.text
    assert "blacklisting ghost" in caplog.text and "host-1" not in caplog.text.partition("blacklisting ")[2].split("\n")[0]


def rank_0_fails() -> None:
    if os.environ["RANK"] == "0":
        raise ValueError("no data here")


def test_a_program_that_fails_at_every_start_stops_the_run(cluster: None) -> None:
    """Rank 0 fails in every launch: its host is blacklisted each time, and after three launches with
    the same error on three hosts the run stops, saying it is the program."""
    job = executor(Stages({"host-1": 1, "host-2": 1, "host-3": 1, "host-4": 1}), min_workers=1)
    job.start()
    try:
        with pytest.raises(LaunchError) as caught:
            job.run(rank_0_fails)
    finally:
        job.shutdown()
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("RayExecutor.run: 3 launches in a row failed with the same error (ValueError at "
                               "test_ray_elastic.py:"), lines[0]
    assert "that is the program, not the hosts" in lines[0]
    assert "on 3 different hosts (host-1, host-2, host-3)" in lines[0]
    assert lines[1] == "epoch 2 failed on 1 of 2 ranks:" and lines[2].startswith("  rank 0 (host-3, pid ")


def test_too_few_slots_within_the_elastic_timeout(cluster: None) -> None:
    job = executor(Stages({"host-1": 1}), min_workers=2, elastic_timeout=1)
    with pytest.raises(LaunchError, match=r"waited 1 s \(elastic_timeout\) for hosts: 1 ranks available, 2 needed "
                       r"\(min_workers 2\); discovered: host-1:1\. Add hosts, or lower min_workers\."):
        job.start()
    assert socket.gethostname()  # the cluster is still usable: nothing was left started
    assert ray.available_resources().get("CPU") == 4
