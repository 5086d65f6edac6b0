"""The unison backend in Ray Train on a local cluster of 4 CPUs: unison.ray.TorchConfig, and Ray's setup
hook with Ray Train's own TorchConfig(backend="unison"); gloo's parameters, a desync named on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.torch")
torch = pytest.importorskip("torch")

from ray import cloudpickle  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig as RayTorchConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

import tests.ray._training as training  # noqa: E402
from unison.ray import TorchConfig  # noqa: E402

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(240)]

cloudpickle.register_pickle_by_value(training)
cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    ray.init(num_cpus=4, include_dashboard=False, logging_level="warning")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def train(config: dict[str, str]) -> None:
    """Ray Train's loop: `config["mode"]` is ``ddp:BACKEND`` (train) or ``desync``."""
    mode = config["mode"]
    call = training.desync if mode == "desync" else (lambda: training.ddp_steps(mode.split(":")[1]))
    training.write_outcome(config["directory"], config["name"], call)


def fit(directory: Path, name: str, mode: str, torch_config: Any) -> None:
    TorchTrainer(train, train_loop_config={"directory": str(directory), "name": name, "mode": mode},
                 torch_config=torch_config, scaling_config=ScalingConfig(num_workers=WORKERS),
                 run_config=RunConfig(storage_path=str(directory), name=name)).fit()


def outcomes(directory: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((directory / f"{name}-{rank}.json").read_text()) for rank in range(WORKERS)]


def same_everywhere(name: str, seen: list[dict[str, Any]]) -> Any:
    """Every rank's parameters, checked identical; rank 0's."""
    assert all("value" in rank for rank in seen), seen
    ranks = torch.tensor([rank["value"] for rank in seen])
    assert all(torch.equal(ranks[0], row) for row in ranks), f"{name}: the ranks differ"
    return ranks[0]


@pytest.fixture(scope="module")
def gloo(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("gloo")
    fit(directory, "gloo", "ddp:gloo", RayTorchConfig(backend="gloo"))
    parameters = same_everywhere("gloo", outcomes(directory, "gloo"))
    assert not torch.equal(parameters, torch.tensor(training.initial_parameters()))
    return parameters


def test_torch_config_trains_as_gloo_does(gloo: Any, tmp_path: Path) -> None:
    fit(tmp_path, "unison", "ddp:unison", TorchConfig())
    assert torch.allclose(same_everywhere("unison", outcomes(tmp_path, "unison")), gloo, rtol=1e-5, atol=1e-6)


def test_the_setup_hook_registers_the_backend_for_rays_own_torch_config(cluster: str, gloo: Any,
                                                                        tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "ray" / "_train_with_hook.py"), cluster, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.allclose(same_everywhere("hook", outcomes(tmp_path, "hook")), gloo, rtol=1e-5, atol=1e-6)


def test_a_desync_is_named_on_every_rank(cluster: str, tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"MismatchError") as caught:
        fit(tmp_path, "desync", "desync", TorchConfig())
    assert type(caught.value).__module__.startswith("ray.")  # Ray Train's error, carrying the rank's
    for seen in outcomes(tmp_path, "desync"):
        assert seen["error"] == "MismatchError"
        assert "Mismatched ALLREDUCE tensor shapes" in seen["message"] and "[3] on rank [1]" in seen["message"]
