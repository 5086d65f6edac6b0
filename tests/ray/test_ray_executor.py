"""unison.ray.RayExecutor on Ray's local cluster of 4 logical CPUs: the CPU cases of Horovod's
test/single/test_ray.py, the ranks ending with gloo's parameters, and failures named on the driver."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from ray import cloudpickle  # noqa: E402

import tests.ray._training as training  # noqa: E402
from unison.errors import LaunchError, NotInitializedError  # noqa: E402
from unison.ray import BaseHorovodWorker, PlacementGroupTimeoutError, RayExecutor  # noqa: E402

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(180)]

# The workers need not import the tests: what they run travels by value.
cloudpickle.register_pickle_by_value(training)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LAYOUTS = [{"num_workers": 4}, {"num_hosts": 1, "num_workers_per_host": 4}]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, float]]:
    """One local cluster for the module: 4 CPUs, and 4 GPUs that are only Ray's bookkeeping (no device
    is touched: the GPU cases check which ids each worker is shown)."""
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, logging_level="warning")
    try:
        yield ray.available_resources()
    finally:
        ray.shutdown()


def settings(**kwargs: Any) -> Any:
    return RayExecutor.create_settings(timeout_s=30, **kwargs)


def resources_back(original: dict[str, float], seconds: float = 10.0) -> bool:
    """Whether the cluster's free resources are all back (Ray frees a removed group's shortly after)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = ray.available_resources()
        if all(now.get(name, 0) == amount for name, amount in original.items() if name in ("CPU", "GPU")):
            return True
        time.sleep(0.2)
    return False


def init_rank(_: Any = None) -> int:
    import unison.torch as hvd

    hvd.init()
    return hvd.rank()


def rank_times(num_epochs: int) -> int:
    import unison.torch as hvd

    hvd.init()
    return hvd.rank() * num_epochs


def log_rank(chief_only: bool = True) -> None:
    from unison.ray import ray_logger

    ray_logger.log({"rank": int(os.environ["RANK"])}, chief_only=chief_only)


def local_rank_after_training() -> int:
    import unison.torch as hvd

    training.horovod_steps()
    return hvd.local_rank()


# -- Horovod's cases ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [{"num_workers": 8}, {"num_hosts": 1, "num_workers_per_host": 8},
                                    {"num_hosts": 2, "num_workers_per_host": 1}],
                         ids=["packed", "one_host", "two_hosts"])
def test_a_cluster_without_room_times_out_placing_the_group(cluster: dict[str, float], layout: dict[str, int]) -> None:
    job = RayExecutor(settings(placement_group_timeout_s=2), **layout)
    with pytest.raises(TimeoutError, match=r"Placement group creation timed out after 2 s: \d workers need CPU \d.*"
                       r"but the cluster has CPU 4 available") as caught:
        job.start()
    assert isinstance(caught.value, PlacementGroupTimeoutError) and isinstance(caught.value, LaunchError)
    job.shutdown()
    assert resources_back(cluster)  # the group was removed: nothing stays reserved


def test_the_worker_class_keeps_its_environment(cluster: dict[str, float]) -> None:
    class Worker(BaseHorovodWorker):
        pass

    assert Worker().hostname() == socket.gethostname()
    actor = ray.remote(BaseHorovodWorker).remote()
    actor.update_env_vars.remote({"TEST": 1123123})
    assert ray.get(actor.env_vars.remote())["TEST"] == "1123123"
    ray.kill(actor)


@pytest.fixture(scope="class")
def executor(cluster: dict[str, float], layout: dict[str, int]) -> Iterator[RayExecutor]:
    job = RayExecutor(settings(), **layout)
    job.start(extra_env_vars={"TRAINING_DATA": "/data/shard", "UNISON_START_TIMEOUT_SECONDS": 45})
    try:
        yield job
    finally:
        job.shutdown()
    assert resources_back(cluster)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["num_workers", "num_hosts"], scope="class")
class TestAStartedExecutor:
    """Calls on one started executor of 4 workers per layout (its workers start once: fresh workers
    spend seconds importing torch)."""

    def test_the_workers_run_on_this_machine(self, executor: RayExecutor) -> None:
        assert set(executor.execute(lambda _: socket.gethostname())) == {socket.gethostname()}
        assert executor.execute_single(lambda _: os.environ["RANK"]) == "0"

    def test_the_extra_variables_are_set_and_win(self, executor: RayExecutor) -> None:
        seen = executor.execute(lambda _: (os.environ["TRAINING_DATA"], os.environ["UNISON_START_TIMEOUT_SECONDS"]))
        assert seen == [("/data/shard", "45")] * 4

    def test_what_rank_0_logs_reaches_the_callbacks(self, executor: RayExecutor) -> None:
        got: list[dict[str, Any]] = []
        executor.run(log_rank, callbacks=[got.append])
        assert got == [{"rank": 0}]
        got.clear()
        executor.run(log_rank, kwargs={"chief_only": False}, callbacks=[got.append, lambda entry: None])
        assert sorted(entry["rank"] for entry in got) == [0, 1, 2, 3]

    def test_every_worker_joins_the_job_with_its_own_rank(self, executor: RayExecutor) -> None:
        assert executor.execute(init_rank) == [0, 1, 2, 3]

    def test_run_passes_arguments(self, executor: RayExecutor) -> None:
        assert executor.run(rank_times, args=[0]) == [0, 0, 0, 0]
        assert executor.run(rank_times, kwargs={"num_epochs": 2}) == [0, 2, 4, 6]

    def test_run_remote_returns_object_refs(self, executor: RayExecutor) -> None:
        refs = executor.run_remote(rank_times, args=[3])
        assert ray.get(refs) == [0, 3, 6, 9]

    def test_horovod_training_runs_on_every_local_rank(self, executor: RayExecutor) -> None:
        calls = executor.statistics()["calls"]
        assert executor.run(local_rank_after_training) == [0, 1, 2, 3]
        assert executor.statistics() == {"workers": 4, "calls": calls + 1, "failed_calls": 0}


@pytest.mark.parametrize("layout", LAYOUTS, ids=["num_workers", "num_hosts"])
def test_the_executable_class_joins_the_job(cluster: dict[str, float], layout: dict[str, int]) -> None:
    class Executable:
        def __init__(self, epochs: int) -> None:
            import unison.torch as hvd

            self.hvd = hvd
            self.epochs = epochs
            hvd.init()

        def rank_epoch(self) -> int:
            return int(self.hvd.rank()) * self.epochs

    job = RayExecutor(settings(), **layout)
    job.start(executable_cls=Executable, executable_args=[2])
    try:
        assert job.execute(lambda worker: worker.rank_epoch()) == [0, 2, 4, 6]
    finally:
        job.shutdown()


@pytest.mark.parametrize("layout", [{"num_hosts": 1, "num_workers_per_host": 4}, {"num_workers": 4}],
                         ids=["num_hosts", "num_workers"])
def test_each_worker_sees_every_gpu_of_its_node(cluster: dict[str, float], layout: dict[str, int]) -> None:
    job = RayExecutor(settings(), use_gpu=True, **layout)
    job.start()
    try:
        seen = job.execute(lambda _: os.environ["CUDA_VISIBLE_DEVICES"])
    finally:
        job.shutdown()
    assert len(set(seen)) == 1 and sorted(seen[0].split(",")) == ["0", "1", "2", "3"]


def test_a_job_in_the_current_placement_group_uses_it(cluster: dict[str, float]) -> None:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.placement_group([{"CPU": 1}] * 4, strategy="PACK")
    ray.get(group.ready(), timeout=30)

    @ray.remote(num_cpus=0)
    class Driver:
        def run(self) -> tuple[bool, list[int]]:
            job = RayExecutor(settings(), num_workers=4, num_hosts=None, num_workers_per_host=None)
            job.start()
            try:
                return job.adapter.placement.created_group, job.run(local_rank_after_training)
            finally:
                job.shutdown()

    where = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_capture_child_tasks=True)
    driver = Driver.options(scheduling_strategy=where).remote()
    try:
        created, local_ranks = ray.get(driver.run.remote(), timeout=120)
    finally:
        ray.kill(driver)
        ray.util.remove_placement_group(group)
    assert created is False and local_ranks == [0, 1, 2, 3]


def start_in_a_group_of_two_bundles(driver_cpus: float, timeout_s: float, num_workers: int) -> tuple[str, float]:
    """Start an executor of `num_workers` from a driver actor (of `driver_cpus`) inside a placement group
    of two 1-CPU bundles; the text of its `PlacementGroupTimeoutError` (or "started") and the seconds
    `start()` took. The group is removed again."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.placement_group([{"CPU": 1}] * 2, strategy="PACK")
    ray.get(group.ready(), timeout=30)

    @ray.remote(num_cpus=driver_cpus)
    class Driver:
        def start(self) -> tuple[str, float]:
            job = RayExecutor(settings(placement_group_timeout_s=timeout_s), num_workers=num_workers)
            began = time.monotonic()
            try:
                job.start()
            except PlacementGroupTimeoutError as exc:
                return str(exc), time.monotonic() - began
            finally:
                job.shutdown()
            return "started", time.monotonic() - began

    where = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_capture_child_tasks=True)
    driver = Driver.options(scheduling_strategy=where).remote()
    try:
        return ray.get(driver.start.remote(), timeout=120)
    finally:
        ray.kill(driver)
        ray.util.remove_placement_group(group)


def test_a_current_placement_group_without_room_for_every_worker_is_named(cluster: dict[str, float]) -> None:
    message, took = start_in_a_group_of_two_bundles(driver_cpus=0, timeout_s=60, num_workers=3)
    # Refused from the group's bundles, before any worker starts: not after the 60 s placement timeout.
    assert message.startswith("The placement group this executor runs in has room for 2 of its 3 workers: its "
                              "bundles "), message
    assert message.endswith("hold 2 of {'CPU': 1}. Give the group a bundle per worker, or pass "
                            "use_current_placement_group=False."), message
    assert took < 30, took
    assert resources_back(cluster)


def test_a_current_placement_group_whose_room_others_hold_times_out_saying_so(cluster: dict[str, float]) -> None:
    # the driver takes one of the group's two bundles: the bundles fit 2 workers, 1 bundle is free
    message, _ = start_in_a_group_of_two_bundles(driver_cpus=1, timeout_s=3, num_workers=2)
    # one worker can never start; the other may have been slower than 3 s too
    assert re.fullmatch(r"[12] of 2 workers did not start within 3 s \(placement_group_timeout_s\) in the placement "
                        r"group this executor runs in: its bundles are large enough, so other tasks \(the driver or "
                        r"trainable itself among them\) hold their room, or they start slowly\. Raise "
                        r"placement_group_timeout_s, or give the group room for the workers beside its other tasks\.",
                        message), message
    assert resources_back(cluster)


# -- unison's: gloo's parameters, failures named -----------------------------------------------------------


def gloo_then_unison_then_horovod() -> dict[str, list[float]]:
    """The same steps on gloo, on unison, and with Horovod's API, one after the other in the same workers."""
    import torch.distributed as dist

    gloo = training.ddp_steps("gloo")
    dist.destroy_process_group()
    unison = training.ddp_steps("unison")
    dist.destroy_process_group()
    return {"gloo": gloo, "unison": unison, "horovod": training.horovod_steps()}


def test_the_ranks_end_with_the_parameters_of_a_gloo_run(cluster: dict[str, float]) -> None:
    import torch

    job = RayExecutor(settings(), num_workers=3)
    job.start()
    try:
        results = job.run(gloo_then_unison_then_horovod)
    finally:
        job.shutdown()
    by_name = {name: torch.tensor([ranks[name] for ranks in results]) for name in ("gloo", "unison", "horovod")}
    for name, ranks in by_name.items():
        assert all(torch.equal(ranks[0], row) for row in ranks), f"{name}: the ranks differ"
    gloo = by_name["gloo"][0]
    assert not torch.equal(gloo, torch.tensor(training.initial_parameters())), "the steps must change the parameters"
    for name in ("unison", "horovod"):
        assert torch.allclose(by_name[name][0], gloo, rtol=1e-5, atol=1e-6), (name, (by_name[name][0] - gloo).abs().max())


def test_a_desync_is_named_on_every_rank(cluster: dict[str, float], tmp_path: Path) -> None:
    job = RayExecutor(settings(), num_workers=3)
    job.start()
    with pytest.raises(LaunchError, match=r"RayExecutor.run failed on 3 of 3 ranks:") as caught:
        job.run(training.write_outcome, args=[str(tmp_path), "desync", training.desync])
    job.shutdown()
    message = str(caught.value)
    for rank in range(3):
        assert f"rank {rank} (" in message
        seen = (tmp_path / f"desync-{rank}.json").read_text()
        assert '"error": "MismatchError"' in seen and "[2] on ranks [0, 2]; [3] on rank [1]" in seen
    assert message.count("MismatchError: Mismatched ALLREDUCE tensor shapes") == 3


def raise_on_rank_1() -> None:
    import torch

    import unison.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 cannot go on")
    hvd.allreduce(torch.ones(2), name="never_complete")


def test_a_worker_that_raises_is_named_with_its_line_and_the_workers_end(cluster: dict[str, float]) -> None:
    job = RayExecutor(settings(), num_workers=3)
    job.start()
    with pytest.raises(LaunchError) as caught:
        job.run(raise_on_rank_1)
    lines = str(caught.value).splitlines()
    assert lines[0] == "RayExecutor.run failed on 3 of 3 ranks:"
    assert lines[1].startswith(f"  rank 1 ({socket.gethostname()}, pid ")
    assert lines[1].endswith("failed: ValueError: rank 1 cannot go on at test_ray_executor.py:"
                             f"{raise_on_rank_1.__code__.co_firstlineno + 7} in raise_on_rank_1")
    assert all("AbortedError: rank 1 (" in line for line in lines[2:4])  # stopped by rank 1's failure, at once
    assert lines[-1] == "The executor's workers were ended; call start() to run again."
    assert isinstance(caught.value.__cause__, ValueError)
    with pytest.raises(NotInitializedError, match=r"RayExecutor.run\(\) was called after a call failed"):
        job.run(init_rank)
    job.shutdown()
    assert resources_back(cluster)


def die_on_rank_1() -> None:
    import torch

    import unison.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        os._exit(3)  # the worker process ends without a word
    hvd.allreduce(torch.ones(2), name="never_complete")


def test_a_worker_process_that_dies_is_named(cluster: dict[str, float]) -> None:
    job = RayExecutor(settings(), num_workers=3)
    job.start()
    with pytest.raises(LaunchError) as caught:
        job.run(die_on_rank_1)
    job.shutdown()
    lines = str(caught.value).splitlines()
    assert lines[1].startswith(f"  rank 1 ({socket.gethostname()}): its worker process ended ("), lines
    assert sorted(line.split(" (")[0].strip() for line in lines[2:4]) == ["rank 0", "rank 2"]


def test_run_remote_refs_raise_each_ranks_own_error(cluster: dict[str, float]) -> None:
    from unison.errors import AbortedError

    job = RayExecutor(settings(), num_workers=3)
    job.start()
    refs = job.run_remote(raise_on_rank_1)
    try:
        with pytest.raises(ValueError, match=r"rank 1 cannot go on"):
            ray.get(refs[1])
        for rank in (0, 2):  # stopped at once by rank 1's failure, naming it
            with pytest.raises(AbortedError, match=r"rank 1 \(.*\) failed: ValueError: rank 1 cannot go on"):
                ray.get(refs[rank], timeout=60)
    finally:
        job.shutdown()


def raise_before_joining() -> int:
    if os.environ["RANK"] == "2":
        raise KeyError("no data for rank 2")
    return init_rank()  # the others wait for rank 2 to join


def test_a_rank_that_fails_before_joining_leaves_none_waiting(cluster: dict[str, float]) -> None:
    job = RayExecutor(settings(), num_workers=3)
    job.start()
    with pytest.raises(LaunchError) as caught:
        job.run(raise_before_joining)
    job.shutdown()
    lines = str(caught.value).splitlines()
    assert "rank 2 (" in lines[1] and "KeyError: 'no data for rank 2'" in lines[1]
    assert sorted(line.split(" (")[0].strip() for line in lines[2:4]) == ["rank 0", "rank 1"]
    assert all("was stopped: still running 10 s after rank 2 failed" in line for line in lines[2:4])
    assert not any("(rank " in line for line in lines[2:4]), lines  # each rank named once: "rank 0 (host) was stopped"


def test_calls_before_start_are_refused(cluster: dict[str, float]) -> None:
    job = RayExecutor(settings(), num_workers=2)
    with pytest.raises(NotInitializedError, match=r"RayExecutor.run\(\) was called before start\(\)"):
        job.run(init_rank)
