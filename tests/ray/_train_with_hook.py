"""A second Ray driver on the running cluster whose job registers the backend with Ray's setup hook,
then trains with Ray Train's own TorchConfig(backend="unison"): ``python _train_with_hook.py ADDRESS DIR``."""

from __future__ import annotations

import sys


def main(address: str, directory: str) -> None:
    import ray
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    import tests.ray._training as training

    cloudpickle.register_pickle_by_value(training)
    ray.init(address=address, logging_level="warning",
             runtime_env={"worker_process_setup_hook": "unison.ray.register_backend"})

    def train(config: dict[str, str]) -> None:
        training.write_outcome(config["directory"], "hook", lambda: training.ddp_steps("unison"))

    TorchTrainer(train, train_loop_config={"directory": directory},
                 torch_config=TorchConfig(backend="unison"), scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=directory, name="hook")).fit()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
