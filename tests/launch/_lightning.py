"""A Lightning script for the launch tests: ``python _lightning.py OUT BACKEND [desync]``.

Started as a person starts it, ``python _lightning.py``: Lightning's own launcher starts the second process
(or, with SLURM's variables in the environment, each process is one task of the step). Each rank trains a
small model three steps with ``DDPStrategy(process_group_backend=BACKEND)`` and writes OUT/params-R, or
OUT/error-R when a collective fails. With ``desync`` rank 1 reduces one metric more than rank 0.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy

import unison.torch  # noqa: F401 - registers the backend

OUT, BACKEND = Path(sys.argv[1]), sys.argv[2]
DESYNC = "desync" in sys.argv[3:]
warnings.filterwarnings("ignore")


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return self.net(batch[0]).square().mean()

    def on_train_batch_end(self, outputs: object, batch: object, index: int) -> None:
        if DESYNC and self.global_rank == 1 and index == 1:
            self.trainer.strategy.reduce(torch.ones(3))  # one reduction more than rank 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.randn(24, 6, generator=torch.Generator().manual_seed(1)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = Model()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=BACKEND),
                         max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    try:
        trainer.fit(model, loader)
    except Exception as exc:  # noqa: BLE001 - written for the test, then raised
        (OUT / f"error-{trainer.global_rank}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    (OUT / f"params-{trainer.global_rank}").write_text(json.dumps({
        "params": [p.detach().reshape(-1).tolist() for p in model.parameters()], "metric": 1.0,
        "backend": dist.get_backend(), "size": dist.get_world_size(), "rank": dist.get_rank()}))


if __name__ == "__main__":
    main()
