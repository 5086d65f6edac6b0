"""The unison backend under Spark's TorchDistributor(local_mode=True, use_gpu=False), on pyspark in local
mode: the same DDP steps end with gloo's parameters on every rank; a desync is named on every rank."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")
torch = pytest.importorskip("torch")

from pyspark import cloudpickle  # noqa: E402
from pyspark.ml.torch.distributor import TorchDistributor  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import tests.ray._training as training  # noqa: E402

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

cloudpickle.register_pickle_by_value(training)  # torchrun's processes need not import the tests
cloudpickle.register_pickle_by_value(sys.modules[__name__])
PROCESSES = 2


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = (SparkSession.builder.master("local[2]").appName("unison-tests")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    try:
        yield session
    finally:
        session.stop()


def gloo_then_unison(directory: str) -> None:
    """On each of TorchDistributor's processes: the steps on gloo, then on unison."""
    import torch.distributed as dist

    training.write_outcome(directory, "gloo", lambda: training.ddp_steps("gloo"))
    dist.destroy_process_group()
    training.write_outcome(directory, "unison", lambda: training.ddp_steps("unison"))
    dist.destroy_process_group()


def desync(directory: str) -> None:
    training.write_outcome(directory, "desync", training.desync)


def distribute(fn: Any, *args: Any) -> Any:
    return TorchDistributor(num_processes=PROCESSES, local_mode=True, use_gpu=False).run(fn, *args)


def outcomes(directory: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((directory / f"{name}-{rank}.json").read_text()) for rank in range(PROCESSES)]


def test_the_ranks_end_with_the_parameters_of_a_gloo_run(spark: Any, tmp_path: Path) -> None:
    distribute(gloo_then_unison, str(tmp_path))
    by_name = {}
    for name in ("gloo", "unison"):
        ranks = torch.tensor([rank["value"] for rank in outcomes(tmp_path, name)])
        assert all(torch.equal(ranks[0], row) for row in ranks), f"{name}: the ranks differ"
        by_name[name] = ranks[0]
    assert not torch.equal(by_name["gloo"], torch.tensor(training.initial_parameters()))
    assert torch.allclose(by_name["unison"], by_name["gloo"], rtol=1e-5, atol=1e-6)


def test_a_desync_is_named_on_every_rank(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        distribute(desync, str(tmp_path))
    for seen in outcomes(tmp_path, "desync"):
        assert seen["error"] == "MismatchError"
        assert "Mismatched ALLREDUCE tensor shapes" in seen["message"] and "[3] on rank [1]" in seen["message"]
