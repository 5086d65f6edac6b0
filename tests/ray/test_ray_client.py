"""unison.ray.RayExecutor from a driver connected with Ray Client: Horovod's remote-client case (the
executor's own work runs as an actor inside the cluster). Its own module: the client server's
context ends the cluster it serves."""

from __future__ import annotations

import sys
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from ray import cloudpickle  # noqa: E402

import tests.ray._training as training  # noqa: E402
from unison.ray import RayExecutor  # noqa: E402

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(180)]

cloudpickle.register_pickle_by_value(training)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def local_rank_after_training() -> int:
    import unison.torch as hvd

    training.horovod_steps()
    return hvd.local_rank()


def rank_times(num_epochs: int) -> int:
    import unison.torch as hvd

    hvd.init()
    return hvd.rank() * num_epochs


def test_a_ray_client_runs_the_job_from_inside_the_cluster() -> None:
    from ray.util.client.ray_client_helpers import ray_start_client_server

    def connect(job_config: Any = None, **kwargs: Any) -> Any:
        if ray.is_initialized():
            return None
        return ray.init(job_config=job_config, num_cpus=4, include_dashboard=False, logging_level="warning")

    assert not ray.util.client.ray.is_connected()
    with ray_start_client_server(ray_connect_handler=connect):
        assert ray.util.client.ray.is_connected()
        job = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=3)
        job.start()
        try:
            assert "(remote)" in repr(job)
            assert job.run(local_rank_after_training) == [0, 1, 2]
            assert ray.get(job.run_remote(rank_times, args=[2])) == [0, 2, 4]
        finally:
            job.shutdown()
